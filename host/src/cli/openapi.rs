//! `proxy-operator openapi`: the discovery API's OpenAPI document, as served.

pub fn run() -> anyhow::Result<()> {
    print!("{}", proxy_operator::discovery::openapi::document_text());
    Ok(())
}
