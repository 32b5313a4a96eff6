//! What a reconcile resolves before it decides: the rendered cloud-init, the port, the
//! credentials (read, or generated into a Secret of their own), as the `Input` decide sees.

use super::Shell;
use crate::api::Proxy;
use crate::controller::context::ReconcileError;
use crate::controller::decide::Input;
use crate::controller::proxy_auth::{self, Credentials};
use crate::controller::secrets::CloudInitError;
use crate::controller::secrets::SecretKey;
use crate::controller::template;
use crate::controller::{input, keyed_spec_hash, spec_hash};
use egress_plugin_host::provider::Provider;

use kube::Resource;
use kube::api::Api;
use std::sync::Arc;
use tracing::info;

/// The cloud-init and port the provider gets, and the credentials the probe sends.
pub(super) struct Resolved {
    pub(super) cloud_init: Vec<u8>,
    pub(super) port: u16,
    pub(super) credentials: Option<Credentials>,
}

impl<'a> Shell<'a> {
    /// Cloud-init bytes (the template rendered), port and credentials, and the [`Input`]
    /// decide sees.
    pub(super) async fn resolve(&self) -> (Input, Option<Resolved>) {
        let spec = &self.proxy.spec;
        let port = match input::port(spec) {
            Ok(p) => p,
            Err(message) => return (Input::Invalid { message }, None),
        };
        let access = proxy_auth::access(&spec.auth, &self.name);
        let source = input::source(&spec.cloud_init);
        let mut referenced = vec![];
        if let Ok(input::Source::Secret { name, .. }) = &source {
            referenced.push(*name);
        }
        if let Some(name) = access.as_ref().ok().and_then(|a| a.source.secret_name())
            && !referenced.contains(&name)
        {
            referenced.push(name);
        }
        self.ctx
            .secrets
            .reference(&self.namespace, &self.name, &referenced);
        let access = match access {
            Ok(a) => a,
            Err(e) => {
                return (
                    Input::Invalid {
                        message: e.to_string(),
                    },
                    None,
                );
            }
        };
        let template = match source {
            Err(message) => return (Input::Invalid { message }, None),
            Ok(input::Source::Inline(text)) => text.as_bytes().to_vec(),
            Ok(input::Source::Secret { name, key }) => {
                let secret = SecretKey::new(&self.namespace, name);
                let held = match self.ctx.secrets.read_all(&self.ctx.client, &secret).await {
                    Ok(held) => held,
                    Err(e) => return (unavailable(&e, e.to_string()), None),
                };
                // Only a Secret meant for cloud-init, never any Secret of the namespace
                // (see `proxy_auth::CLOUD_INIT_LABEL`); labelling it re-runs this Proxy at once.
                if !held.labelled_for_cloud_init {
                    let refused = proxy_auth::Refused::CloudInitNotLabelled {
                        namespace: self.namespace.clone(),
                        name: name.to_string(),
                    };
                    return (
                        Input::Unavailable {
                            message: refused.to_string(),
                        },
                        None,
                    );
                }
                match crate::controller::secrets::value(&secret, &held, key) {
                    Ok(bytes) => bytes,
                    Err(e) => return (unavailable(&e, e.to_string()), None),
                }
            }
        };
        let (credentials, key) = match self.credentials(&access.source).await {
            Ok(Some((c, key))) => (Some(c), key),
            Ok(None) => (None, None),
            Err(input) => return (input, None),
        };
        // Sensitive as values of their own, in every encoding, before anything is rendered
        // or called: every later call of this provider, for any Proxy, is scrubbed of them
        // and no ID it returns may hold them (not only as part of this cloud-init).
        // Refused when the redactor has no room left (`--redaction-memory`): the Proxy
        // then waits, saying so, and nothing is handed to the plugin.
        if let (Some(p), Some(c)) = (&self.provider, &credentials)
            && let Err(e) = p.remember_credentials(&self.uid, &c.username, &c.password)
        {
            return (
                Input::Unavailable {
                    message: e.to_string(),
                },
                None,
            );
        }
        let values = template::Values {
            port,
            name: &self.name,
            credentials: credentials
                .as_ref()
                .map(|c| (c.username.as_str(), c.password.as_str())),
            allowed_clients: &access.allowed_clients,
        };
        let rendered = match template::render(&template, &values) {
            Ok(r) => r,
            Err(e) => {
                return (
                    Input::Invalid {
                        message: e.to_string(),
                    },
                    None,
                );
            }
        };
        let cloud_init = rendered.bytes.clone();
        // Every call of this provider scrubs this document from then on, not only Create.
        if let Some(p) = &self.provider
            && let Err(e) = p.remember_cloud_init(&self.uid, &cloud_init)
        {
            return (
                Input::Unavailable {
                    message: e.to_string(),
                },
                None,
            );
        }
        let mut hash = spec_hash(&spec.placement, &cloud_init, port, spec.ip_family);
        if rendered.has_credentials() {
            // Never an unkeyed hash of a password into the status (see `keyed`).
            hash = keyed_spec_hash(&hash, key.as_deref().unwrap_or_default());
        }
        (
            Input::Resolved { hash },
            Some(Resolved {
                cloud_init,
                port,
                credentials,
            }),
        )
    }

    /// The Proxy's credentials and the UID of the Secret they are in; for
    /// `type: Generated`, the Secret is created first when it does not exist.
    async fn credentials(
        &self,
        source: &proxy_auth::Source,
    ) -> Result<Option<(Credentials, Option<String>)>, Input> {
        let Some(name) = source.secret_name() else {
            return Ok(None);
        };
        let field = source.field();
        let key = SecretKey::new(&self.namespace, name);
        let held = match self.ctx.secrets.read_all(&self.ctx.client, &key).await {
            Ok(h) => h,
            Err(CloudInitError::NotFound { .. })
                if matches!(source, proxy_auth::Source::Generated(_)) =>
            {
                match self.create_generated_secret(name).await? {
                    Generated::Created(c, uid) => return Ok(Some((c, uid))),
                    Generated::Exists(held) => held,
                }
            }
            Err(CloudInitError::NotFound { .. }) => {
                return Err(Input::Unavailable {
                    message: format!("Secret {key} not found ({field})"),
                });
            }
            Err(e) => return Err(unavailable(&e, format!("{e} ({field})"))),
        };
        // Only a Secret meant for this Proxy's credentials: never adopted, never any
        // Secret of the namespace (see `proxy_auth::may_use`). Checked before a value is read.
        proxy_auth::may_use(
            source,
            &self.namespace,
            name,
            held.labelled_for_proxies,
            held.controller.as_deref(),
            &self.uid,
        )
        .map_err(|refused| match refused {
            // The Proxy's own name is taken: only a spec change (or removing that
            // Secret) helps.
            proxy_auth::Refused::NotOwned { .. } => Input::Invalid {
                message: refused.to_string(),
            },
            // Labelling the Secret fixes it, and its change re-runs this Proxy at once.
            proxy_auth::Refused::NotLabelled { .. }
            | proxy_auth::Refused::CloudInitNotLabelled { .. } => Input::Unavailable {
                message: refused.to_string(),
            },
        })?;
        // A Secret the user can fix by editing it: a condition, retried (its change
        // re-runs this Proxy at once).
        let credentials = proxy_auth::from_values(
            &key.to_string(),
            field,
            held.value(proxy_auth::USERNAME_KEY),
            held.value(proxy_auth::PASSWORD_KEY),
        )
        .map_err(|e| Input::Unavailable {
            message: e.to_string(),
        })?;
        Ok(Some((credentials, held.uid.clone())))
    }

    /// Creates the Secret of generated credentials, owned by the Proxy (so it goes with it
    /// wherever owner references are collected) and labelled with its name.
    async fn create_generated_secret(&self, name: &str) -> Result<Generated, Input> {
        let credentials = proxy_auth::generate().map_err(|e| Input::Unreadable {
            message: format!("generating credentials: the random number generator failed: {e}"),
        })?;
        let secret = k8s_openapi::api::core::v1::Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(self.namespace.clone()),
                labels: Some([(proxy_auth::PROXY_LABEL.to_string(), self.name.clone())].into()),
                owner_references: Some(vec![
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                        api_version: Proxy::api_version(&()).into_owned(),
                        kind: Proxy::kind(&()).into_owned(),
                        name: self.name.clone(),
                        uid: self.uid.clone(),
                        controller: Some(true),
                        block_owner_deletion: None,
                    },
                ]),
                ..Default::default()
            },
            type_: Some("Opaque".into()),
            string_data: Some(
                [
                    (
                        proxy_auth::USERNAME_KEY.to_string(),
                        credentials.username.clone(),
                    ),
                    (
                        proxy_auth::PASSWORD_KEY.to_string(),
                        credentials.password.clone(),
                    ),
                ]
                .into(),
            ),
            ..Default::default()
        };
        let api: Api<k8s_openapi::api::core::v1::Secret> =
            Api::namespaced(self.ctx.client.clone(), &self.namespace);
        match api.create(&kube::api::PostParams::default(), &secret).await {
            Ok(created) => {
                info!(secret = name, "generated the Proxy's credentials");
                self.ctx.secrets.hold(&created);
                Ok(Generated::Created(credentials, created.metadata.uid))
            }
            // Created meanwhile (by the reconcile before this one, whose answer the Secret
            // watch has not shown yet, or by hand): read it.
            Err(kube::Error::Api(s)) if s.code == 409 => match api.get_opt(name).await {
                Ok(Some(found)) => {
                    self.ctx.secrets.hold(&found);
                    let rv = found.metadata.resource_version.clone().unwrap_or_default();
                    Ok(Generated::Exists(Arc::new(
                        crate::controller::secrets::Held::at_version(&found, rv),
                    )))
                }
                Ok(None) => Err(Input::Unreadable {
                    message: format!(
                        "Secret {}/{name} (spec.auth.type Generated) was created and deleted \
                         meanwhile; retrying",
                        self.namespace
                    ),
                }),
                Err(e) => Err(Input::Unreadable {
                    message: format!("reading Secret {}/{name}: {e}", self.namespace),
                }),
            },
            Err(e) => Err(Input::Unreadable {
                message: format!(
                    "creating Secret {}/{name} (spec.auth.type Generated): {e}",
                    self.namespace
                ),
            }),
        }
    }

    /// Deletes the Secret of generated credentials, if there is one and this Proxy owns
    /// it (a user's Secret of the same name stays).
    pub(super) async fn delete_generated_secret(&self) -> Result<(), ReconcileError> {
        let name = proxy_auth::generated_secret_name(&self.name);
        let api: Api<k8s_openapi::api::core::v1::Secret> =
            Api::namespaced(self.ctx.client.clone(), &self.namespace);
        let Some(secret) = api.get_opt(&name).await? else {
            return Ok(());
        };
        let owned = secret
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.controller == Some(true) && o.uid == self.uid);
        if !owned {
            return Ok(());
        }
        let params = kube::api::DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: secret.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(&name, &params).await {
            Ok(_) => {
                info!(
                    secret = name.as_str(),
                    "deleted the Proxy's generated credentials"
                );
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// What creating the Secret of generated credentials came to.
enum Generated {
    /// Created, with these credentials, as the Secret with this UID.
    Created(Credentials, Option<String>),
    /// It existed already (its owner is still to be checked).
    Exists(Arc<crate::controller::secrets::Held>),
}

/// A Secret that could not be read: a condition when the user can fix it (missing Secret
/// or key), else an API failure retried with backoff.
fn unavailable(e: &CloudInitError, message: String) -> Input {
    if e.is_unavailable() {
        Input::Unavailable { message }
    } else {
        Input::Unreadable { message }
    }
}
