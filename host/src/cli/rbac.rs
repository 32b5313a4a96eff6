//! `proxy-operator rbac`: the RBAC rules generated from the list of API calls the operator
//! makes.

pub fn run() -> anyhow::Result<()> {
    print!("{}", proxy_operator::rbac::yaml()?);
    Ok(())
}
