//! The union of the spans one scrub finds, bounded in memory and in work.
//!
//! A scrub reports every occurrence of every pattern, overlapping ones included (see the
//! module docs of [`super`]). Where every byte of a text starts an occurrence of several
//! patterns, that is several spans per byte: a plugin that marked eight values made of one
//! byte (`aaaaaaaa` to `aaaaaaaaaaaaaaa`, `host.mark-sensitive`) and then logged 3 MiB of
//! it made the host collect 25 million spans for one log line, 389 MiB at the peak (the
//! Deployment's limit was 328 MiB). A user's cloud-init lines of one byte at many lengths
//! did the same with any plugin that echoes its input.
//!
//! So the spans are merged as they come (memory: the disjoint runs found, plus as many
//! pending), and one text is looked at for at most [`MATCHES_PER_BYTE`] matches per byte
//! plus [`MATCHES_FLOOR`]. A text past that is withheld whole, never shown in part:
//! ordinary texts match a few times per value they hold, far below it.

use std::ops::Range;

/// Matches one text may give per byte of it before it is withheld whole.
pub const MATCHES_PER_BYTE: usize = 2;
/// Matches any text may give, however short, before it is withheld whole.
pub const MATCHES_FLOOR: usize = 4096;
/// Pending spans past which they are merged, at the least.
const MERGE_AT: usize = 1024;

/// Spans found in one text, merged as they come, and what is left of its budget.
pub struct Spans {
    spans: Vec<Range<usize>>,
    /// How many of `spans` are merged (sorted, disjoint, not touching).
    merged: usize,
    left: usize,
}

impl Spans {
    /// An empty union with the budget of a text of `len` bytes.
    pub fn for_text(len: usize) -> Self {
        Spans::with_budget(len.saturating_mul(MATCHES_PER_BYTE) + MATCHES_FLOOR)
    }

    /// An empty union that looks at `budget` matches at most.
    pub fn with_budget(budget: usize) -> Self {
        Spans {
            spans: Vec::new(),
            merged: 0,
            left: budget,
        }
    }

    /// Counts one match found, and adds its span when it has one (a match the caller does
    /// not want, such as a fragment where only whole values count, costs the same to
    /// find). `false` once the budget is spent: the caller stops looking.
    pub fn visit(&mut self, span: Option<Range<usize>>) -> bool {
        if self.left == 0 {
            return false;
        }
        self.left -= 1;
        if let Some(span) = span {
            self.spans.push(span);
            if self.spans.len() >= (2 * self.merged).max(MERGE_AT) {
                self.merge();
            }
        }
        true
    }

    /// Whether any span was added.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// The union: sorted, disjoint spans, touching ones joined.
    pub fn merged(mut self) -> Vec<Range<usize>> {
        self.merge();
        self.spans
    }

    /// Every span added, sorted, none merged: for tests that compare two ways of finding
    /// them. Panics if some were merged already (more than `MERGE_AT`).
    #[cfg(test)]
    pub fn unmerged(mut self) -> Vec<Range<usize>> {
        assert_eq!(self.merged, 0, "spans were merged already");
        self.spans.sort_unstable_by_key(|r| (r.start, r.end));
        self.spans
    }

    fn merge(&mut self) {
        self.spans.sort_unstable_by_key(|r| r.start);
        let mut out = 0;
        for i in 0..self.spans.len() {
            let r = self.spans[i].clone();
            if out > 0 && r.start <= self.spans[out - 1].end {
                let last = &mut self.spans[out - 1];
                last.end = last.end.max(r.end);
            } else {
                self.spans[out] = r;
                out += 1;
            }
        }
        self.spans.truncate(out);
        self.merged = out;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_and_touching_spans_become_one() {
        let mut s = Spans::for_text(100);
        for r in [10..20, 0..5, 15..30, 30..32, 40..41, 5..6] {
            assert!(s.visit(Some(r)));
        }
        assert_eq!(s.merged(), vec![0..6, 10..32, 40..41]);
    }

    #[test]
    fn a_span_at_every_byte_holds_one_run() {
        // What a run of one byte against eight values of it gives: 8 spans a byte.
        let mut s = Spans::with_budget(usize::MAX);
        for at in 0..100_000 {
            for len in 8..16 {
                assert!(s.visit(Some(at..at + len)));
            }
            assert!(s.spans.len() <= 2 * MERGE_AT, "{} pending", s.spans.len());
        }
        assert_eq!(s.merged(), vec![0..99_999 + 15]);
    }

    #[test]
    fn the_budget_ends_the_search() {
        let mut s = Spans::for_text(10);
        let budget = 10 * MATCHES_PER_BYTE + MATCHES_FLOOR;
        for i in 0..budget {
            assert!(s.visit((i % 2 == 0).then_some(i..i + 1)), "{i}");
        }
        assert!(!s.visit(None), "past the budget");
        assert!(!s.visit(Some(0..1)));
    }
}
