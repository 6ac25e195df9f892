//! Hedera's demand estimation (Al-Fares et al., NSDI 2010, section 4.2): the natural demand of
//! each elephant, the rate it would reach if only the sender's and the receiver's NICs limited
//! it, as the max-min fair share found by alternating sender and receiver passes until nothing
//! changes. Demands are fractions of the NIC rate.

/// Below this, two demands are the same (they are sums and quotients of small fractions).
const EPSILON: f64 = 1e-9;
/// The passes converge in a few rounds; this bounds a pathological input.
const MAX_ROUNDS: usize = 1_000;

/// The estimated demand of each flow `(sender, receiver)`, in input order.
pub fn estimate(flows: &[(u32, u32)]) -> Vec<f64> {
    let n = flows.len();
    let mut demand = vec![0.0f64; n];
    let mut converged = vec![false; n];
    let mut receiver_limited = vec![false; n];
    let mut senders: Vec<u32> = flows.iter().map(|f| f.0).collect();
    senders.sort_unstable();
    senders.dedup();
    let mut receivers: Vec<u32> = flows.iter().map(|f| f.1).collect();
    receivers.sort_unstable();
    receivers.dedup();
    let from = |s: u32| (0..n).filter(move |&i| flows[i].0 == s);
    let to = |r: u32| (0..n).filter(move |&i| flows[i].1 == r);

    for _ in 0..MAX_ROUNDS {
        let before = demand.clone();
        // Senders: what converged flows leave of the NIC, shared equally by the others.
        for &s in &senders {
            let (mut fixed, mut open) = (0.0, 0usize);
            for i in from(s) {
                if converged[i] {
                    fixed += demand[i];
                } else {
                    open += 1;
                }
            }
            if open == 0 {
                continue;
            }
            let share = ((1.0 - fixed) / open as f64).max(0.0);
            for i in from(s).filter(|&i| !converged[i]) {
                demand[i] = share;
            }
        }
        // Receivers: an oversubscribed receiver gives each flow the max-min fair share, the
        // flows that ask less (sender-limited) keeping what they ask.
        for &r in &receivers {
            let mut total = 0.0;
            let mut limited = 0usize;
            for i in to(r) {
                receiver_limited[i] = true;
                total += demand[i];
                limited += 1;
            }
            if total <= 1.0 + EPSILON {
                continue;
            }
            let mut sender_limited = 0.0;
            let mut share = 1.0 / limited as f64;
            loop {
                let mut flipped = false;
                limited = 0;
                for i in to(r) {
                    if !receiver_limited[i] {
                        continue;
                    }
                    if demand[i] < share - EPSILON {
                        sender_limited += demand[i];
                        receiver_limited[i] = false;
                        flipped = true;
                    } else {
                        limited += 1;
                    }
                }
                if limited == 0 {
                    break;
                }
                share = (1.0 - sender_limited) / limited as f64;
                if !flipped {
                    break;
                }
            }
            for i in to(r).filter(|&i| receiver_limited[i]) {
                demand[i] = share;
                converged[i] = true;
            }
        }
        if before
            .iter()
            .zip(&demand)
            .all(|(a, b)| (a - b).abs() < EPSILON)
        {
            break;
        }
    }
    demand
}

#[cfg(test)]
mod tests {
    use super::estimate;

    const A: u32 = 0;
    const B: u32 = 1;
    const C: u32 = 2;
    const D: u32 = 3;

    fn close(got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() < 1e-9, "flow {i}: {g} != {w} (all: {got:?})");
        }
    }

    #[test]
    fn a_lone_flow_gets_the_whole_nic() {
        close(&estimate(&[(A, B)]), &[1.0]);
    }

    #[test]
    fn a_sender_shares_its_nic_equally() {
        close(&estimate(&[(A, B), (A, C), (A, D)]), &[1.0 / 3.0; 3]);
    }

    /// Four hosts: A sends to B and C; B and D also send to C. C is oversubscribed (1/2 + 1 + 1)
    /// and gives each of its three flows 1/3; A's flow to B then takes what A's flow to C
    /// cannot use: 2/3.
    #[test]
    fn a_receiver_limit_frees_the_senders_other_flows() {
        close(
            &estimate(&[(A, B), (A, C), (D, C), (B, C)]),
            &[2.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0],
        );
    }

    /// A sends four flows (1/4 each, one of them to D); B and C each send one to D. D's
    /// max-min share: A's flow keeps its 1/4 (sender-limited), B's and C's get 3/8 each.
    #[test]
    fn a_sender_limited_flow_keeps_its_rate_at_a_busy_receiver() {
        close(
            &estimate(&[(A, B), (A, C), (A, C), (A, D), (B, D), (C, D)]),
            &[0.25, 0.25, 0.25, 0.25, 0.375, 0.375],
        );
    }

    /// Hedera's stride and permutation patterns: one flow per sender and per receiver, so every
    /// demand is the whole NIC.
    #[test]
    fn a_permutation_is_all_ones() {
        let flows: Vec<(u32, u32)> = (0..16).map(|i| (i, (i + 5) % 16)).collect();
        close(&estimate(&flows), &[1.0; 16]);
    }

    #[test]
    fn demands_never_oversubscribe_a_nic() {
        // A dense, uneven pattern: every sender and receiver ends within its NIC.
        let mut flows = Vec::new();
        for s in 0..8u32 {
            for k in 0..(s % 4 + 1) {
                flows.push((s, (s * 3 + k * 5 + 1) % 8));
            }
        }
        let d = estimate(&flows);
        for h in 0..8u32 {
            let out: f64 = flows
                .iter()
                .zip(&d)
                .filter(|(f, _)| f.0 == h)
                .map(|(_, d)| d)
                .sum();
            let inn: f64 = flows
                .iter()
                .zip(&d)
                .filter(|(f, _)| f.1 == h)
                .map(|(_, d)| d)
                .sum();
            assert!(
                out <= 1.0 + 1e-9 && inn <= 1.0 + 1e-9,
                "host {h}: out {out}, in {inn}"
            );
        }
        assert!(d.iter().all(|x| *x > 0.0));
    }
}
