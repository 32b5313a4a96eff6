//! How much of a message the reconciler writes into a condition or an event.

/// Events carry at most 1 kB of note; conditions get a generous but bounded message.
pub(crate) const EVENT_NOTE_MAX: usize = 1024;
pub(crate) const CONDITION_MESSAGE_MAX: usize = 4096;

/// Cuts `s` to at most `max` bytes on a character boundary.
pub(crate) fn truncate(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_respects_char_boundaries() {
        let mut s = "ééé".to_string();
        truncate(&mut s, 3);
        assert_eq!(s, "é");
        let mut s = "abc".to_string();
        truncate(&mut s, 10);
        assert_eq!(s, "abc");
    }
}
