//! An emulator of Azure Resource Manager for the resources one egress proxy is made of (a
//! public IP, a network interface, a VM and its OS disk), of the Microsoft identity
//! platform's token endpoint, and of the Azure Retail Prices API, written from Azure's
//! published REST specifications (`Azure/azure-rest-api-specs`) so that a plugin written
//! against it speaks real ARM.
//!
//! # Where a plugin points
//!
//! Everything is served by one emulator on `http://127.0.0.1:PORT` (`AzureEmulator::url`);
//! paths tell the three services apart. A plugin configured for the emulator replaces
//! - the authority host `https://login.microsoftonline.com` by the emulator's URL: tokens
//!   come from `{url}/{tenant}/oauth2/v2.0/token` ([`AzureEmulator::token_url`]);
//! - the ARM endpoint `https://management.azure.com` by the emulator's URL;
//! - the prices endpoint `https://prices.azure.com` by the emulator's URL.
//!
//! # Specifications followed
//!
//! | Route | Spec file (under `specification/`) | api-version read |
//! |---|---|---|
//! | VMs: PUT, GET (`$expand=instanceView\|userData`), DELETE, `instanceView`, lists (`$expand=instanceView`), `start` / `powerOff` / `deallocate` / `restart`, `simulateEviction` | `compute/resource-manager/Microsoft.Compute/ComputeRP/stable/2025-04-01/virtualMachine.json`, `computeRPCommon.json`, examples `VirtualMachine_Create_WithSshAuthentication.json`, `VirtualMachine_Get.json`, `VirtualMachine_Get_InstanceView.json` | 2025-04-01 |
//! | Disks: GET, DELETE, lists | `compute/.../DiskRP/stable/2024-03-02/disk.json` | 2024-03-02 |
//! | Public IPs, NICs: PUT, GET, DELETE, lists | `network/resource-manager/Microsoft.Network/stable/2024-07-01/publicIpAddress.json`, `networkInterface.json`, examples `NetworkInterfaceCreate.json`, `NetworkInterfaceGet.json`, `PublicIpAddressCreateCustomizedValues.json` | 2024-07-01 |
//! | `GET /subscriptions/{sub}/resources`, `.../resourceGroups/{rg}/resources` | `resources/resource-manager/Microsoft.Resources/stable/2021-04-01/resources.json` (`Resources_List`, `Resources_ListByResourceGroup`) | 2021-04-01 |
//! | errors, operation status | `common-types/resource-management/v5/types.json` (`ErrorResponse`, `OperationStatusResult`), the `CloudError`s and `x-ms-long-running-operation(-options)` of the files above | v5 |
//! | `POST /{tenant}/oauth2/v2.0/token` | Entra ID's `v2-oauth2-client-creds-grant-flow` reference (see `auth.rs`) | v2.0 |
//! | `GET /api/retail/prices` | "Azure Retail Prices overview" (cost-management docs, see `prices.rs`) | — |
//!
//! Each type accepts the api-versions of [`ApiVersions`] (the versions read plus earlier
//! ones whose shapes are the same for these fields). A missing `api-version` is 400
//! `MissingApiVersionParameter`; one a resource provider does not know, 400
//! `NoRegisteredProviderFound` (naming the supported versions); one the generic lists do
//! not know, 400 `InvalidApiVersionParameter`, as ARM answers each.
//!
//! # ARM
//!
//! Every call needs `Authorization: Bearer <token issued by this emulator>`: without the
//! header 401 `AuthenticationFailed`, not `Bearer` 401 `AuthenticationFailedInvalidHeader`,
//! unknown 401 `InvalidAuthenticationToken`, expired 401 `ExpiredAuthenticationToken`, each
//! with `WWW-Authenticate: Bearer authorization_uri="{url}/{tenant}", error="invalid_token",
//! error_description=...`. Errors are `{"error": {"code", "message", "target"?,
//! "details"?}}` ([`ArmError`]). Paths match namespaces, types and `resourceGroups`
//! case-insensitively, and IDs compare case-insensitively. An unknown subscription is 404
//! `SubscriptionNotFound`, an unknown resource group 404 `ResourceGroupNotFound`, a missing
//! resource 404 `ResourceNotFound` ("The Resource 'Microsoft.Compute/virtualMachines/x'
//! under resource group 'rg' was not found...").
//!
//! **Writes are long-running operations.** A `PUT` that creates answers 201 with the
//! resource in `provisioningState` `Creating` (VMs) or `Updating` (network resources) and
//! `Azure-AsyncOperation: {url}/subscriptions/{sub}/providers/{namespace}/locations/
//! {location}/operations/{id}?api-version=...` plus `Retry-After` ([`AzureConfig::retry_after`]).
//! A `PUT` of an existing resource is an update: 200, tags replaced, the other properties
//! kept, `Azure-AsyncOperation` naming the operation in progress (or one already over).
//! `DELETE` answers 202 with `Azure-AsyncOperation` and `Location` (`.../operationResults/
//! {id}`), the resource `Deleting` until its operation ends; a `DELETE` of a resource being
//! deleted answers 202 with the same operation; of one that does not exist, 204. `POST`
//! `start`, `powerOff`, `deallocate`, `restart` answer 202 the same way. The operation URL
//! answers Compute's `{"startTime", "endTime"?, "status", "name"}` or Network's
//! `{"status"}`, `InProgress` / `Succeeded` / `Failed` (with `error`); the `Location` URL
//! answers 202 while it runs, then 200 (Compute) or 204 (Network), or the failure. An
//! operation ends on [`AzureConfig::schedule`] (deletes: [`AzureConfig::delete_schedule`]):
//! with the default `AfterReads(1)` the first poll of the operation, or read of its
//! resource, sees it running and the next sees it over. A new public IP gets its address
//! when its creation ends (Static; a Dynamic one when the VM using it runs, released when
//! it is deallocated), from 198.51.100.10 up ([`AzureConfig::first_ipv4`]). A new VM reads
//! `Creating` and `PowerState/starting`, then `Succeeded` and `PowerState/running`. Its
//! `osProfile.customData` (base64, refused otherwise with 400 `InvalidParameter`) is never
//! returned, as on Azure; a later `PUT` changing it is 409 `PropertyChangeNotAllowed`.
//!
//! **References as ARM enforces them.** A NIC naming a subnet or public IP that does not
//! exist (or is in another region) is 400 `InvalidResourceReference`; a public IP
//! reference without `id` is 400 `InvalidRequestFormat`; a public IP another NIC uses is
//! 400 `PublicIPAddressInUse`. A VM naming a NIC that does not exist is 404 `NotFound`
//! ("Resource {id} not found."), one another VM uses 400 `NicInUse`. Deleting a public IP a
//! NIC uses is 400 `PublicIPAddressCannotBeDeleted`, a NIC a VM uses 400 `NicInUse`, a disk
//! a VM uses 409 `OperationNotAllowed`. The VM makes its OS disk (`{vm}_OsDisk_1_{guid}` or
//! `osDisk.name`), without the VM's tags, as Azure does. When a VM's delete ends, its OS
//! disk is deleted if `storageProfile.osDisk.deleteOption` is `Delete` (default `Detach`:
//! kept, unattached); each NIC of `networkProfile.networkInterfaces[]` is deleted if its
//! `properties.deleteOption` is `Delete` (kept, detached, otherwise), and a deleted NIC's
//! public IPs go with it if their `deleteOption` is `Delete` (set on the IP or through the
//! NIC's `ipConfigurations[].properties.publicIPAddress.properties.deleteOption`), else
//! stay, detached. A crash between a proxy's steps therefore leaves parts only a
//! garbage collection by tag finds.
//!
//! **Tags.** Tag names may not contain `<>%&\?/` (400 `InvalidTagNameCharacters`), so the
//! contract's marks are written as described in [`tags`] (`egress-uid`, ...); values are
//! at most 256 characters, 50 tags a resource.
//!
//! **Lists.** `GET /subscriptions/{sub}/resources` and `.../resourceGroups/{rg}/resources`
//! answer `{"value": [GenericResourceExpanded], "nextLink"?}` (`id`, `name`, `type`,
//! `location`, `tags`, `sku`, `managedBy`; `$expand=createdTime,changedTime,
//! provisioningState`) in pages of [`AzureConfig::page_size`] or `$top`, `nextLink`
//! carrying `$skiptoken`. `$filter` takes `tagName eq 'k'` (with `and tagValue eq 'v'`) or
//! `eq` on `resourceType`, `name`, `location`, `resourceGroup` and `substringof()`; a tag
//! filter combined with anything else is 400 `InvalidFilterInQueryString`, and with a tag
//! name and value the results carry no `tags` (the spec: "When you filter by a tag name
//! and value, the tags for each resource are not returned in the results"). The typed
//! lists (`.../providers/Microsoft.Compute/virtualMachines` in a group or the subscription,
//! and the same for the other types) answer full resources in pages of
//! [`AzureConfig::list_page_size`], VMs with their instance view on `$expand=instanceView`
//! (`VirtualMachines_List`'s `ExpandTypeForListVMs`).
//!
//! **Spot.** `priority: Spot` with `evictionPolicy` (`Deallocate` by default or `Delete`) and
//! `billingProfile.maxPrice` (-1 by default). A max price under the Spot price of the
//! price list is 409 `OperationNotAllowed`. [`AzureEmulator::evict`], the API's
//! `simulateEviction` (204) and the shared `reclaim` evict: with `Delete` the VM reads
//! `Deleting` and `PowerState/deallocating` until its delete ends, then is gone with its
//! parts per their `deleteOption`s; with `Deallocate` it reads `PowerState/deallocated`.
//! Evicting a regular VM is 409 `OperationNotAllowed`. Without Spot capacity
//! ([`AzureEmulator::refuse_spot`], or the shared `spot-capacity` with
//! [`AzureConfig::spot_refusal`]) a Spot `PUT` is 409 `SkuNotAvailable` ("Following SKUs have
//! failed for Capacity Restrictions"), or is accepted and its operation fails with
//! `OverconstrainedAllocationRequest` / `AllocationFailed`, leaving the VM `Failed`
//! (instance view `ProvisioningState/failed/{code}`) until deleted or re-`PUT`.
//!
//! **Throttling.** Every ARM answer carries `x-ms-ratelimit-remaining-subscription-reads`
//! (GET) or `-writes` (others): ARM's documented 12,000 / 1,200 an hour less one while no
//! limit is enforced, the bucket's whole tokens when one is ([`AzureConfig::rate_limit`],
//! one bucket for reads and one for writes). A call past it is 429
//! `SubscriptionRequestsThrottled` with `Retry-After` and reaches nothing behind.
//!
//! # Control surface
//!
//! [`AzureEmulator`] is the framework's [`Served`] over [`Backend`], which implements
//! [`Model`](crate::framework::Model). One instance is one VM; its id is the VM's resource
//! ID (a unique VM name or `rg/name` are accepted too), its scope its location, its address
//! the public IP of its primary NIC, its user data the decoded `customData`, its labels its
//! tags with the marks decoded; the dump's secondary resources are its NICs, public IPs
//! and disks (`attached_to` the VM). The state the dump shows is the VM's power state once
//! provisioned (`running`, `deallocated`), its `provisioningState` otherwise (`Creating`,
//! `Deleting`, `Failed`).
//! - `hold`: the VM reads `Creating` / `PowerState/starting` and its creation does not end
//!   until released. Its public IP keeps its address: on Azure a static IP has its address
//!   before the VM runs.
//! - `set_state`: a provisioning state (`Creating`, `Updating`, `Deleting`, `Failed`,
//!   `Succeeded`, `Canceled`) sets `provisioningState`; anything else is a power state
//!   (`PowerState/{state}`) with `provisioningState: Succeeded`.
//! - `set_address`: `None` takes the address off the public IP; `Some` sets it (making a
//!   public IP on the primary NIC when there is none).
//! - `set_locked`: a lock is an operation in progress, as Azure has no lock of its own:
//!   writes to the VM (`PUT`, `DELETE`, actions) answer 409 `AnotherOperationInProgress`
//!   (the Network RP's wording); reads answer.
//! - `start_slow_delete`: the VM reads `Deleting` until `finish_deletes`.
//! - `plant`: a running VM with a NIC, a Standard static public IP and an OS disk, all with
//!   `deleteOption: Delete` and the marks as tags, in the resource group or location named
//!   (the first resource group by default).
//! - faults answer as ARM does: `server-error` 500 `InternalExecutionError`, `quota` 409
//!   `OperationNotAllowed` (the cores quota message), `rate-limit` 429
//!   `SubscriptionRequestsThrottled`, `auth` 401 `InvalidAuthenticationToken`; `create` is
//!   every `PUT`, `get` every single-resource `GET` and operation poll, `delete` every
//!   `DELETE`, `list` every list.
//! - `fail_scope` takes a location or a resource group: a list touching a resource there
//!   fails whole with ARM's 500 `InternalServerError`.
//! - `reclaim` evicts; `spot-capacity` refuses Spot creates as [`AzureConfig::spot_refusal`].
//! - Azure-only routes: `POST /_emulator/spot-refusal {"refuse": "SkuNotAvailable" |
//!   "Overconstrained" | "AllocationFailed" | null}`, `GET /_emulator/resources` (every
//!   resource with tags and attachment), `GET /_emulator/requests`.
//!
//! # Verified, assumed, simplified
//!
//! From the specs: paths, methods, status codes (PUT 200/201, DELETE 200/202/204,
//! `simulateEviction` 204), body schemas and their examples' shapes, the LRO header and
//! final-state conventions, `deleteOption`s, `priority` / `evictionPolicy` /
//! `billingProfile`, the instance view's status codes, the generic list's filter grammar
//! and paging. Error codes and messages quoted from captured answers (the source is named
//! next to each in `error.rs` and `model.rs`): `MissingApiVersionParameter`,
//! `InvalidApiVersionParameter`, `NoRegisteredProviderFound`, `ResourceNotFound`,
//! `InvalidFilterInQueryString`, `InvalidResourceReference`, `InvalidRequestFormat`,
//! `NicInUse`, `PublicIPAddressCannotBeDeleted`, `StandardSkuPublicIPAddressesMustBeStatic`,
//! `SkuNotAvailable` (409), the quota 409 `OperationNotAllowed`, the AADSTS codes.
//! Assumed (no captured answer found): the VM's missing-NIC answer (404 `NotFound`), the
//! `PublicIPAddressInUse`, max-price, lock and eviction-of-a-regular-VM answers, the
//! throttling message, `InvalidTag*` codes for lengths, the `ExpiredAuthenticationToken`
//! time format. Simplified: the VM creates on existing NICs only
//! (`networkInterfaceConfigurations` is refused), with an OS disk `FromImage` and no data
//! disks; images are not checked; a `PUT` of an existing resource changes its tags (and a
//! Spot VM's max price) only; tokens are JWT-shaped but unsigned; Retail Prices serve USD
//! only; subnets and resource groups come from the configuration and are not resources.

mod api;
mod auth;
mod control;
mod error;
mod model;
mod percent;
mod prices;
mod render;
pub mod tags;
#[cfg(test)]
mod tests;
mod write;

pub use error::ArmError;
pub use model::{ArmResource, Backend, ResourceKind};

use std::fmt;
use std::net::Ipv4Addr;
use std::sync::Arc;

use axum::Router;

use crate::control::FaultOp;
use crate::framework::{Schedule, Served, Shared};
use crate::rate_limit::RateLimit;
use crate::real_proxy::RealProxies;

/// The tenant the emulator's token endpoint serves (`/{tenant}/oauth2/v2.0/token`).
pub const EMULATOR_TENANT: &str = "7a1c0e5d-0000-4000-8000-00000000a2e1";
/// The subscription every ARM path names.
pub const EMULATOR_SUBSCRIPTION: &str = "5b0c3f1e-0000-4000-8000-00000000a2e1";
/// A service principal with a client secret.
pub const EMULATOR_CLIENT_ID: &str = "0c1d2e3f-0000-4000-8000-00000000a2e1";
pub const EMULATOR_CLIENT_SECRET: &str = "emulator~client~secret";
/// A service principal with a federated credential (workload identity): any non-empty
/// `client_assertion` is accepted for it.
pub const EMULATOR_FEDERATED_CLIENT_ID: &str = "1d2e3f40-0000-4000-8000-00000000a2e1";
/// The scope of an ARM token.
pub const MANAGEMENT_SCOPE: &str = "https://management.azure.com/.default";
/// The resource group and subnet a default configuration knows.
pub const EMULATOR_RESOURCE_GROUP: &str = "egress-rg";
pub const EMULATOR_LOCATION: &str = "westeurope";

/// A service principal the token endpoint knows.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientSpec {
    pub client_id: String,
    /// The client secret it authenticates with (`client_secret`), if any.
    pub secret: Option<String>,
    /// Workload identity: `None` refuses client assertions; `Some([])` accepts any
    /// non-empty `client_assertion`; otherwise only the assertions listed.
    pub federated: Option<Vec<String>>,
}

impl fmt::Debug for ClientSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientSpec")
            .field("client_id", &self.client_id)
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .field("federated", &self.federated.as_ref().map(Vec::len))
            .finish()
    }
}

/// A resource group that exists before the plugin runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceGroupSpec {
    pub name: String,
    pub location: String,
}

/// A subnet that exists before the plugin runs (NICs reference it by its full ID).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubnetSpec {
    /// `/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Network/virtualNetworks/{vnet}/subnets/{name}`.
    pub id: String,
    pub location: String,
    /// The first address of its /24; private addresses are handed out from `.4`.
    pub prefix: Ipv4Addr,
}

/// One meter of the Retail Prices API.
#[derive(Debug, Clone, PartialEq)]
pub struct RetailPrice {
    pub arm_region_name: String,
    pub location: String,
    pub arm_sku_name: String,
    /// `B1s`, `B1s Spot`, `B1s Low Priority`.
    pub sku_name: String,
    /// `Virtual Machines BS Series` (Linux) or `... Windows`.
    pub product_name: String,
    pub meter_name: String,
    pub retail_price: f64,
    /// `Consumption`, `Reservation`, `DevTestConsumption`.
    pub price_type: String,
    pub unit_of_measure: String,
    pub service_name: String,
}

impl RetailPrice {
    /// A Linux pay-as-you-go meter of a VM size (`Standard_B1s` -> sku `B1s`); `spot` makes
    /// it the Spot meter (`B1s Spot`).
    pub fn vm(region: &str, arm_sku: &str, series: &str, price: f64, spot: bool) -> Self {
        let short = arm_sku.trim_start_matches("Standard_").replace('_', " ");
        let sku = if spot { format!("{short} Spot") } else { short };
        RetailPrice {
            arm_region_name: region.into(),
            location: display_location(region),
            arm_sku_name: arm_sku.into(),
            sku_name: sku.clone(),
            product_name: format!("Virtual Machines {series} Series"),
            meter_name: sku,
            retail_price: price,
            price_type: "Consumption".into(),
            unit_of_measure: "1 Hour".into(),
            service_name: "Virtual Machines".into(),
        }
    }

    /// The same meter for Windows (a product name ending in ` Windows`).
    pub fn windows(mut self, price: f64) -> Self {
        self.product_name.push_str(" Windows");
        self.retail_price = price;
        self
    }
}

fn display_location(region: &str) -> String {
    match region {
        "westeurope" => "EU West".into(),
        "northeurope" => "EU North".into(),
        "eastus" => "US East".into(),
        "westus2" => "US West 2".into(),
        other => other.to_string(),
    }
}

/// The api-versions each resource type accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiVersions {
    /// `Microsoft.Compute/virtualMachines` and Compute's operation status.
    pub compute: Vec<String>,
    /// `Microsoft.Compute/disks`.
    pub disks: Vec<String>,
    /// `Microsoft.Network/publicIPAddresses`, `networkInterfaces` and Network's operations.
    pub network: Vec<String>,
    /// `Microsoft.Resources`: the generic resource lists.
    pub resources: Vec<String>,
}

impl Default for ApiVersions {
    fn default() -> Self {
        let v = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
        ApiVersions {
            compute: v(&["2023-09-01", "2024-03-01", "2024-07-01", "2024-11-01", "2025-04-01"]),
            disks: v(&["2023-04-02", "2023-10-02", "2024-03-02"]),
            network: v(&[
                "2023-09-01",
                "2023-11-01",
                "2024-01-01",
                "2024-03-01",
                "2024-05-01",
                "2024-07-01",
            ]),
            resources: v(&["2021-04-01", "2022-09-01", "2023-07-01", "2024-03-01"]),
        }
    }
}

/// How the next Spot VM create is refused, as Azure refuses when it has no Spot capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpotRefusal {
    /// The PUT itself answers 409 `SkuNotAvailable` ("Following SKUs have failed for
    /// Capacity Restrictions"); nothing is created.
    SkuNotAvailable,
    /// The PUT is accepted (201 `Creating`), then the create operation ends `Failed` with
    /// `OverconstrainedAllocationRequest`, leaving the VM in `provisioningState: Failed`.
    Overconstrained,
    /// As `Overconstrained`, with `AllocationFailed`.
    AllocationFailed,
}

/// Everything configurable. `AzureConfig::default()` knows the tenant, subscription and
/// service principals of the `EMULATOR_*` constants, resource groups `egress-rg`
/// (westeurope) and `egress-rg-us` (eastus) each with a subnet, a few B-series sizes and
/// their prices, and hands out addresses from 198.51.100.0/24 (TEST-NET-2).
#[derive(Clone)]
pub struct AzureConfig {
    pub tenant_id: String,
    pub subscription_id: String,
    pub clients: Vec<ClientSpec>,
    /// `expires_in` of every issued token, in seconds (Azure: 3599).
    pub token_lifetime: u64,
    pub resource_groups: Vec<ResourceGroupSpec>,
    /// Locations resources may be created in (ARM's normalized names).
    pub locations: Vec<String>,
    pub subnets: Vec<SubnetSpec>,
    pub vm_sizes: Vec<String>,
    pub api_versions: ApiVersions,
    /// When create, update and power operations finish: `AfterReads(n)` counts polls of the
    /// operation and reads of the resource. Default `AfterReads(1)`.
    pub schedule: Schedule,
    /// When delete operations finish (the resource is gone after). Default `AfterReads(1)`.
    pub delete_schedule: Schedule,
    /// `Retry-After` of long-running operations, in seconds (Azure sends 10; default 1).
    pub retry_after: u64,
    /// Page size of the generic resource lists (`/resources`); ARM's is 1000.
    pub page_size: usize,
    /// Page size of the typed lists (`.../virtualMachines` and the others).
    pub list_page_size: usize,
    /// The first public IPv4 address handed out; later ones count up from it.
    pub first_ipv4: Ipv4Addr,
    pub prices: Vec<RetailPrice>,
    /// Items per page of the Retail Prices API (Azure: 100).
    pub prices_page_size: usize,
    /// How Spot creates are refused while the control surface says there is no Spot
    /// capacity (`POST /_emulator/spot-capacity {"available": false}`).
    pub spot_refusal: SpotRefusal,
    /// VMs per location before creates answer the core-quota 409.
    pub vm_limit: Option<usize>,
    /// ARM's throttling, enforced (one bucket for reads, one for writes).
    pub rate_limit: Option<RateLimit>,
    pub real_proxies: Option<Arc<RealProxies>>,
}

impl AzureConfig {
    /// The first configured subnet's ID (`egress-rg`'s in a default configuration).
    pub fn default_subnet(&self) -> String {
        self.subnets.first().map(|s| s.id.clone()).unwrap_or_default()
    }
}

impl Default for AzureConfig {
    fn default() -> Self {
        let sub = EMULATOR_SUBSCRIPTION;
        let subnet = |rg: &str, vnet: &str, loc: &str, third: u8| SubnetSpec {
            id: format!(
                "/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Network/virtualNetworks/{vnet}/subnets/default"
            ),
            location: loc.into(),
            prefix: Ipv4Addr::new(10, 0, third, 0),
        };
        let rg = |name: &str, location: &str| ResourceGroupSpec {
            name: name.into(),
            location: location.into(),
        };
        let mut prices = Vec::new();
        for (region, cheap) in [("westeurope", 1.0), ("eastus", 0.9)] {
            for (sku, series, price, spot) in [
                ("Standard_B1s", "BS", 0.0124, 0.0025),
                ("Standard_B1ms", "BS", 0.0248, 0.005),
                ("Standard_B2s", "BS", 0.0496, 0.0099),
            ] {
                let p = |x: f64| (x * cheap * 10_000.0).round() / 10_000.0;
                prices.push(RetailPrice::vm(region, sku, series, p(price), false));
                prices.push(
                    RetailPrice::vm(region, sku, series, p(price * 1.5), false)
                        .windows(p(price * 1.5)),
                );
                prices.push(RetailPrice::vm(region, sku, series, p(spot), true));
            }
        }
        AzureConfig {
            tenant_id: EMULATOR_TENANT.into(),
            subscription_id: sub.into(),
            clients: vec![
                ClientSpec {
                    client_id: EMULATOR_CLIENT_ID.into(),
                    secret: Some(EMULATOR_CLIENT_SECRET.into()),
                    federated: None,
                },
                ClientSpec {
                    client_id: EMULATOR_FEDERATED_CLIENT_ID.into(),
                    secret: None,
                    federated: Some(Vec::new()),
                },
            ],
            token_lifetime: 3599,
            resource_groups: vec![
                rg(EMULATOR_RESOURCE_GROUP, "westeurope"),
                rg("egress-rg-us", "eastus"),
            ],
            locations: vec!["westeurope".into(), "eastus".into()],
            subnets: vec![
                subnet(EMULATOR_RESOURCE_GROUP, "egress-vnet", "westeurope", 0),
                subnet("egress-rg-us", "egress-vnet-us", "eastus", 1),
            ],
            vm_sizes: ["Standard_B1s", "Standard_B1ms", "Standard_B2s"].map(String::from).to_vec(),
            api_versions: ApiVersions::default(),
            schedule: Schedule::AfterReads(1),
            delete_schedule: Schedule::AfterReads(1),
            retry_after: 1,
            page_size: 1000,
            list_page_size: 50,
            first_ipv4: Ipv4Addr::new(198, 51, 100, 10),
            prices,
            prices_page_size: 100,
            spot_refusal: SpotRefusal::SkuNotAvailable,
            vm_limit: None,
            rate_limit: None,
            real_proxies: None,
        }
    }
}

impl fmt::Debug for AzureConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AzureConfig")
            .field("tenant_id", &self.tenant_id)
            .field("subscription_id", &self.subscription_id)
            .field("clients", &self.clients)
            .field("resource_groups", &self.resource_groups)
            .field("locations", &self.locations)
            .field("subnets", &self.subnets)
            .field("vm_sizes", &self.vm_sizes)
            .field("schedule", &self.schedule)
            .field("delete_schedule", &self.delete_schedule)
            .field("page_size", &self.page_size)
            .field("rate_limit", &self.rate_limit)
            .field("real_proxies", &self.real_proxies)
            .finish_non_exhaustive()
    }
}

/// A running Azure emulator on 127.0.0.1: the token endpoint, ARM and the Retail Prices
/// API on one port. Stops, closing every connection, when dropped.
pub type AzureEmulator = Served<Backend>;

impl Served<Backend> {
    /// Start on an OS-chosen port; ready to answer when this returns.
    pub fn start(config: AzureConfig) -> AzureEmulator {
        Self::start_on_port(config, 0).expect("bind 127.0.0.1:0")
    }

    pub fn start_on_port(config: AzureConfig, port: u16) -> std::io::Result<AzureEmulator> {
        let (listener, url) = crate::framework::bind(port)?;
        let state = Shared::new(Backend::new(config, url));
        let app: Router<Shared<Backend>> = api::router(&state);
        Ok(Served::serve("azure-emulator", listener, state, app))
    }

    /// `http://127.0.0.1:PORT/{tenant}/oauth2/v2.0/token`: the token endpoint (a plugin's
    /// "authority host" is the emulator's URL).
    pub fn token_url(&self) -> String {
        let tenant = self.lock().cfg.tenant_id.clone();
        format!("{}/{tenant}/oauth2/v2.0/token", self.url())
    }

    /// The ID of a resource: `kind` in resource group `rg` named `name`.
    pub fn resource_id(&self, kind: ResourceKind, rg: &str, name: &str) -> String {
        self.lock().id_of(kind, rg, name)
    }

    /// Every public IP, NIC, disk and VM, with tags and what it is attached to: what a test
    /// checks for leaks.
    pub fn resources(&self) -> Vec<ArmResource> {
        self.lock().resources()
    }

    /// The resource as a `GET` would show it (by full ID, any case), without counting as a
    /// read.
    pub fn resource(&self, id: &str) -> Option<serde_json::Value> {
        self.lock().render_by_id(id)
    }

    /// Evict a Spot VM as Azure does (by VM ID, `rg/name` or a unique name): with
    /// `evictionPolicy: Delete` it is `Deleting` (`PowerState/deallocating`) until its
    /// delete finishes on the delete schedule, then gone with its parts per their
    /// `deleteOption`s; with `Deallocate` it is `PowerState/deallocated`. `false` for an
    /// unknown VM or one that is not Spot.
    pub fn evict(&self, id: &str) -> bool {
        self.lock().evict(id).is_ok()
    }

    /// Refuse Spot capacity from now on (`None`: grant it again).
    pub fn refuse_spot(&self, refusal: Option<SpotRefusal>) {
        self.lock().spot_refusal = refusal;
    }

    /// The next `count` calls of `op` answer `error` (codes the shared fault kinds do not
    /// cover).
    pub fn inject_error(&self, op: FaultOp, error: ArmError, count: u32) {
        self.lock().inject_error(op, error, count);
    }

    /// Every issued token is refused from now on (`ExpiredAuthenticationToken`).
    pub fn expire_tokens(&self) {
        self.lock().expire_tokens();
    }

    /// Tokens issued so far.
    pub fn token_grants(&self) -> u32 {
        self.lock().grants
    }
}
