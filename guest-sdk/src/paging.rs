//! Bounded paging: follow a backend's pages to the end, with a hard bound, converting
//! each page as it arrives.
//!
//! Two things go wrong with lists in a plugin. A backend (or a proxy in front of it) whose
//! "next page" never ends would pin the call until the host kills it; so the loop has a
//! bound on pages and on items, and a cursor that does not move forward fails the list at
//! once. And holding every raw backend object until the end costs memory the host caps
//! per call (at 10,000 servers, several MiB); so each page is converted to what the plugin
//! keeps before the next is fetched. Every failure fails the list whole: a short list
//! would let orphan collection vouch for what it never saw.

use crate::ProviderError;
use std::fmt;

/// One page of a backend's answer: its items and where the next page starts (`None` on
/// the last page).
pub struct Page<P, C> {
    pub items: Vec<P>,
    pub next: Option<C>,
}

/// A position in a list. A cursor must move forward: a page number must grow, an opaque
/// token must change; otherwise the backend is looping.
pub trait Cursor: fmt::Display {
    /// Whether `next` is a step forward from `self`.
    fn advances_to(&self, next: &Self) -> bool;
}

impl Cursor for u64 {
    fn advances_to(&self, next: &Self) -> bool {
        next > self
    }
}

/// An opaque continuation token; the empty token is the first page.
impl Cursor for String {
    fn advances_to(&self, next: &Self) -> bool {
        !next.is_empty() && next != self
    }
}

/// The bounds of one listing, and what it lists (for messages).
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// `Hetzner server list`: names the list in errors.
    pub what: &'static str,
    pub max_pages: usize,
    /// Items seen (kept or not) across all pages.
    pub max_items: usize,
}

impl Bounds {
    /// Every item of the list starting at `first`, each passed through `keep` as its page
    /// arrives. `fetch` gets the cursor of the page to read and returns that page; its
    /// errors end the list. Errors of the bounds are transient, `BadPagination`: the
    /// backend may recover, and nothing was decided from a partial list.
    pub fn collect<C: Cursor, P, T>(
        &self,
        first: C,
        mut fetch: impl FnMut(&C) -> Result<Page<P, C>, ProviderError>,
        mut keep: impl FnMut(P) -> Option<T>,
    ) -> Result<Vec<T>, ProviderError> {
        let mut out = Vec::new();
        let (mut cursor, mut seen) = (first, 0usize);
        for _ in 0..self.max_pages {
            let page = fetch(&cursor)?;
            seen += page.items.len();
            if seen > self.max_items {
                let msg = format!(
                    "{} holds more than {} items: refusing to vouch for it",
                    self.what, self.max_items
                );
                return Err(bad_pagination(msg));
            }
            out.extend(page.items.into_iter().filter_map(&mut keep));
            match page.next {
                None => return Ok(out),
                Some(next) if cursor.advances_to(&next) => cursor = next,
                Some(next) => {
                    let msg = format!(
                        "{} went from page {cursor} to {next}: refusing a list that may loop",
                        self.what
                    );
                    return Err(bad_pagination(msg));
                }
            }
        }
        let msg = format!(
            "{} is longer than {} pages: refusing to vouch for it",
            self.what, self.max_pages
        );
        Err(bad_pagination(msg))
    }
}

fn bad_pagination(msg: String) -> ProviderError {
    ProviderError::transient(msg).with_code("BadPagination")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorClass;

    const BOUNDS: Bounds = Bounds {
        what: "test list",
        max_pages: 4,
        max_items: 10,
    };

    /// A backend whose pages are `pages[n-1]` with numbered cursors from 1.
    fn numbered(pages: Vec<(Vec<u32>, Option<u64>)>) -> Result<Vec<u32>, ProviderError> {
        let mut fetched = Vec::new();
        let out = BOUNDS.collect(
            1u64,
            |&n| {
                fetched.push(n);
                let (items, next) = pages[n as usize - 1].clone();
                Ok(Page { items, next })
            },
            |i| (i % 2 == 0).then_some(i * 10),
        );
        assert!(fetched.windows(2).all(|w| w[1] > w[0]), "{fetched:?}");
        out
    }

    #[test]
    fn pages_table() {
        type Case = (Vec<(Vec<u32>, Option<u64>)>, Result<Vec<u32>, &'static str>);
        let cases: Vec<Case> = vec![
            (vec![(vec![], None)], Ok(vec![])),
            (
                vec![(vec![1, 2], Some(2)), (vec![3, 4], None)],
                Ok(vec![20, 40]),
            ),
            // Skipping a page number is allowed (a backend's own step); going back is not.
            (
                vec![(vec![2], Some(3)), (vec![], None), (vec![4], None)],
                Ok(vec![20, 40]),
            ),
            (vec![(vec![2], Some(1))], Err("went from page 1 to 1")),
            (
                vec![(vec![], Some(2)), (vec![], Some(1))],
                Err("went from page 2 to 1"),
            ),
            (
                vec![
                    (vec![], Some(2)),
                    (vec![], Some(3)),
                    (vec![], Some(4)),
                    (vec![], Some(5)),
                ],
                Err("longer than 4 pages"),
            ),
            (
                vec![(vec![0; 6], Some(2)), (vec![0; 5], None)],
                Err("more than 10 items"),
            ),
            (
                vec![(vec![0; 5], Some(2)), (vec![0; 5], None)],
                Ok(vec![0; 10]),
            ),
        ];
        for (pages, want) in cases {
            let shown = format!("{pages:?}");
            match (numbered(pages), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{shown}"),
                (Err(e), Err(want)) => {
                    assert!(e.message.contains(want), "{shown}: {}", e.message);
                    assert!(e.message.starts_with("test list "), "{}", e.message);
                    assert_eq!(
                        (e.class, e.code.as_deref()),
                        (ErrorClass::Transient, Some("BadPagination"))
                    );
                }
                (got, want) => panic!("{shown}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn tokens_and_fetch_errors() {
        let answers = ["a", "b", ""];
        let mut calls = 0;
        let got = BOUNDS.collect(
            String::new(),
            |t: &String| {
                calls += 1;
                let i = if t.is_empty() {
                    0
                } else {
                    answers.iter().position(|a| a == t).unwrap() + 1
                };
                let next = answers
                    .get(i)
                    .filter(|a| !a.is_empty())
                    .map(|a| a.to_string());
                Ok(Page {
                    items: vec![i],
                    next,
                })
            },
            Some,
        );
        assert_eq!((got.unwrap(), calls), (vec![0, 1, 2], 3));

        let looping = BOUNDS.collect(
            String::new(),
            |_| {
                Ok(Page {
                    items: vec![1],
                    next: Some("same".to_string()),
                })
            },
            Some,
        );
        assert!(
            looping
                .unwrap_err()
                .message
                .contains("from page same to same")
        );

        let failing: Result<Vec<u8>, _> = BOUNDS.collect(
            1u64,
            |_| Err::<Page<u8, u64>, _>(ProviderError::quota("slow down")),
            Some,
        );
        assert_eq!(failing.unwrap_err().class, ErrorClass::QuotaExceeded);
    }
}
