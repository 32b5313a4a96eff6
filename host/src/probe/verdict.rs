//! From a stream of probe results to the `Healthy` verdict, with thresholds so that one
//! lost packet does not flip a proxy out of the discovery list and one lucky probe does
//! not put a flapping one back. Pure: the engine feeds it, tests drive it directly.

use super::connect::{ProbeError, ProbeOk};
use std::time::Duration;

/// How many results in a row change the verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    /// Failures in a row that make a healthy proxy unhealthy.
    pub failure: u32,
    /// Successes in a row that make an unhealthy (or never probed) proxy healthy.
    pub success: u32,
}

impl Default for Thresholds {
    /// Kubernetes' readiness-probe defaults: three failures, one success.
    fn default() -> Self {
        Thresholds {
            failure: 3,
            success: 1,
        }
    }
}

/// The verdict for one proxy and the streaks behind it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub healthy: bool,
    /// Condition reason: `Healthy`, `NotProbed`, or the last failure's reason.
    pub reason: String,
    /// Human-readable detail of the last result.
    pub message: String,
    pub latency: Option<Duration>,
    /// When the last probe finished; `None` before the first.
    pub probed_at: Option<std::time::SystemTime>,
    failures: u32,
    successes: u32,
}

impl Default for Verdict {
    fn default() -> Self {
        Verdict {
            healthy: false,
            reason: "NotProbed".into(),
            message: "no probe has run yet".into(),
            latency: None,
            probed_at: None,
            failures: 0,
            successes: 0,
        }
    }
}

impl Verdict {
    /// Failures in a row since the last success.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Folds one result in; returns whether `healthy` changed.
    pub fn observe(&mut self, result: &Result<ProbeOk, ProbeError>, t: Thresholds) -> bool {
        let before = self.healthy;
        match result {
            Ok(ok) => {
                self.successes += 1;
                self.failures = 0;
                self.latency = Some(ok.latency);
                if !self.healthy && self.successes >= t.success.max(1) {
                    self.healthy = true;
                }
                if self.healthy {
                    self.reason = "Healthy".into();
                    self.message = match &ok.egress_ip {
                        Some(ip) => format!("CONNECT ok in {:?}, egress from {ip}", ok.latency),
                        None => format!("CONNECT ok in {:?}", ok.latency),
                    };
                }
            }
            Err(e) => {
                self.failures += 1;
                self.successes = 0;
                self.latency = None;
                if self.healthy && self.failures >= t.failure.max(1) {
                    self.healthy = false;
                }
                // Keep reporting the failure even while the threshold holds the verdict:
                // the message is how an operator sees a proxy about to drop out.
                if !self.healthy {
                    self.reason = e.reason().into();
                }
                self.message = if self.healthy {
                    format!(
                        "{e} ({} of {} failures before unhealthy)",
                        self.failures, t.failure
                    )
                } else {
                    e.to_string()
                };
            }
        }
        before != self.healthy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok() -> Result<ProbeOk, ProbeError> {
        Ok(ProbeOk {
            latency: Duration::from_millis(3),
            egress_ip: None,
        })
    }

    fn refused() -> Result<ProbeOk, ProbeError> {
        Err(ProbeError::Refused {
            target: "t:443".into(),
            status: 403,
            text: "Forbidden".into(),
        })
    }

    #[test]
    fn thresholds_decide_each_transition() {
        let t = Thresholds {
            failure: 3,
            success: 2,
        };
        // (name, each result good or not, (healthy, reason) after each)
        type Case<'a> = (&'a str, &'a [bool], &'a [(bool, &'a str)]);
        let cases: &[Case] = &[
            ("never probed stays NotProbed", &[], &[]),
            (
                "success threshold 2 from the start",
                &[true, true],
                &[(false, "NotProbed"), (true, "Healthy")],
            ),
            (
                "a failure before becoming healthy is reported at once",
                &[false],
                &[(false, "TunnelRefused")],
            ),
            (
                "two failures keep a healthy proxy healthy, the third does not",
                &[true, true, false, false, false],
                &[
                    (false, "NotProbed"),
                    (true, "Healthy"),
                    (true, "Healthy"),
                    (true, "Healthy"),
                    (false, "TunnelRefused"),
                ],
            ),
            (
                "a success resets the failure streak",
                &[true, true, false, false, true, false, false],
                &[
                    (false, "NotProbed"),
                    (true, "Healthy"),
                    (true, "Healthy"),
                    (true, "Healthy"),
                    (true, "Healthy"),
                    (true, "Healthy"),
                    (true, "Healthy"),
                ],
            ),
            (
                "recovery needs the success streak again",
                &[true, true, false, false, false, true, true],
                &[
                    (false, "NotProbed"),
                    (true, "Healthy"),
                    (true, "Healthy"),
                    (true, "Healthy"),
                    (false, "TunnelRefused"),
                    (false, "TunnelRefused"),
                    (true, "Healthy"),
                ],
            ),
        ];
        for (name, results, want) in cases {
            let mut v = Verdict::default();
            for (i, good) in results.iter().enumerate() {
                let r = if *good { ok() } else { refused() };
                let before = v.healthy;
                let changed = v.observe(&r, t);
                assert_eq!(changed, before != v.healthy, "{name} #{i}");
                assert_eq!((v.healthy, v.reason.as_str()), want[i], "{name} #{i}");
            }
            if results.is_empty() {
                assert_eq!((v.healthy, v.reason.as_str()), (false, "NotProbed"));
            }
        }
    }

    #[test]
    fn a_held_verdict_still_says_a_failure_is_counting() {
        let mut v = Verdict::default();
        v.observe(&ok(), Thresholds::default());
        v.observe(&refused(), Thresholds::default());
        assert!(v.healthy);
        assert!(v.message.contains("1 of 3 failures"), "{}", v.message);
    }
}
