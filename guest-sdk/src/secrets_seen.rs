//! The secret values this call has read, so that what the plugin itself writes (its
//! outcome lines) never carries them. Each call runs in a fresh instance, so the list never
//! outlives the call it belongs to.

use std::cell::RefCell;

thread_local! {
    static SECRETS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Shorter values are not cut: a 1-3 character secret would mangle every line, and is no
/// secret worth the name.
const MIN_SECRET_LEN: usize = 4;

/// Remember a secret value so outcome lines never carry it.
pub(crate) fn remember_secret(value: &str) {
    let value = value.trim();
    if value.len() >= MIN_SECRET_LEN {
        SECRETS.with_borrow_mut(|s| {
            if !s.iter().any(|v| v == value) {
                s.push(value.to_string());
            }
        });
    }
}

pub(crate) fn scrub(mut line: String) -> String {
    SECRETS.with_borrow(|secrets| {
        for s in secrets {
            if line.contains(s.as_str()) {
                line = line.replace(s.as_str(), "[secret]");
            }
        }
    });
    line
}
