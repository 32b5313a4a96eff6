//! Two answers every REST plugin reads the same way, on top of its [`Classifier`]: a read
//! of one resource whose absence is an answer, not an error (`get`, and the look before a
//! `delete`), and a delete whose target may already be gone (the contract's "deleting
//! something already gone succeeds"). Written once, the backend's own not-found verdict is
//! the only thing that turns into `None` or "done", never a bare 404.

use crate::ProviderError;
use crate::classify::Classifier;
use crate::http::HttpError;

impl Classifier {
    /// `Some` with the answer, `None` when the backend says the resource does not exist;
    /// any other failure classified.
    pub fn found<T>(&self, answer: Result<T, HttpError>) -> Result<Option<T>, ProviderError> {
        match answer {
            Ok(v) => Ok(Some(v)),
            Err(e) if self.is_gone(&e) => Ok(None),
            Err(e) => Err(self.classify(e)),
        }
    }

    /// A delete (or a removing action): `true` when it took effect, `false` when the
    /// backend says the target was already gone; any other failure classified.
    pub fn removed<T>(&self, answer: Result<T, HttpError>) -> Result<bool, ProviderError> {
        self.found(answer).map(|v| v.is_some())
    }
}

#[cfg(test)]
mod tests {
    use crate::ErrorClass;
    use crate::classify::{Classifier, Kind, Rule};
    use crate::http::HttpError;

    const TABLE: Classifier = Classifier {
        backend: "Test",
        code_at: "/code",
        message_at: "/message",
        rules: &[
            Rule::status_code(404, "not_found", Kind::Gone),
            Rule::status(404, Kind::Invalid),
        ],
    };

    fn status(status: u16, body: &str) -> Result<u8, HttpError> {
        Err(HttpError::Status {
            status,
            body: body.as_bytes().to_vec(),
            retry_after: None,
        })
    }

    #[test]
    fn only_the_backends_not_found_is_absence() {
        assert_eq!(TABLE.found(Ok::<_, HttpError>(7)).unwrap(), Some(7));
        assert_eq!(
            TABLE.found(status(404, r#"{"code":"not_found"}"#)).unwrap(),
            None
        );
        assert!(TABLE.removed(Ok::<_, HttpError>(())).unwrap());
        assert!(
            !TABLE
                .removed(status(404, r#"{"code":"not_found"}"#))
                .unwrap()
        );
        // A proxy's 404 page is not the backend's verdict.
        let e = TABLE.found(status(404, "<html>")).unwrap_err();
        assert_eq!(e.class, ErrorClass::Permanent);
        let e = TABLE.removed(status(503, "")).unwrap_err();
        assert_eq!(e.class, ErrorClass::Transient);
    }
}
