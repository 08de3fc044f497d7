//! Random sequences of operations checked against a simple model of the outbox:
//! appends, batches, claims, acks, releases, rotations, closes and reopens.

use std::collections::{BTreeMap, BTreeSet};

use segwal::sim::Rng;
use segwal::{Error, Options, Outbox, Seq};

use crate::tmp;

/// What the outbox must hold: every record appended and not acknowledged, with
/// its payload, and which of them are claimed.
#[derive(Default)]
struct Model {
    live: BTreeMap<Seq, Vec<u8>>,
    claimed: BTreeSet<Seq>,
    /// Acknowledged records that may come back after a reopen (acknowledgements
    /// are in memory; a record comes back unless its segment was deleted).
    acked: BTreeMap<Seq, Vec<u8>>,
}

impl Model {
    fn pending(&self) -> impl Iterator<Item = &Seq> {
        self.live.keys().filter(|s| !self.claimed.contains(s))
    }
}

fn run(seed: u64, steps: usize) {
    let (_t, dir) = tmp();
    // Leases that never run out during a run: the model holds claims for
    // as long as it likes.
    let options = || {
        Options::default()
            .segment_bytes(2048)
            .lease(std::time::Duration::from_secs(3600))
    };
    let mut rng = Rng::new(seed);
    let mut outbox = Outbox::open(&dir, options()).expect("open");
    let mut model = Model::default();
    let mut last_seq = Seq::from(0);
    for step in 0..steps {
        let ctx = || format!("seed {seed} step {step}");
        match rng.below(100) {
            0..=34 => {
                let len = rng.below(300) as usize;
                let payload: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
                let seq = outbox.append(&payload).expect("append");
                assert!(seq > last_seq, "{}: seq not increasing", ctx());
                last_seq = seq;
                model.live.insert(seq, payload);
            }
            35..=44 => {
                let n = rng.below(5) as usize;
                let payloads: Vec<Vec<u8>> = (0..n).map(|i| vec![step as u8; i * 10]).collect();
                let seqs = outbox.append_batch(&payloads).expect("batch");
                for (seq, payload) in seqs.into_iter().zip(payloads) {
                    assert!(seq > last_seq, "{}", ctx());
                    last_seq = seq;
                    model.live.insert(seq, payload);
                }
            }
            45..=64 => {
                let max = 1 + rng.below(8) as usize;
                let expected: Vec<Seq> = model.pending().take(max).copied().collect();
                let got = outbox.claim(max).expect("claim");
                let seqs: Vec<Seq> = got.iter().map(|r| r.seq()).collect();
                assert_eq!(seqs, expected, "{}: claim order", ctx());
                for r in &got {
                    assert_eq!(r.payload(), model.live[&r.seq()].as_slice(), "{}", ctx());
                    model.claimed.insert(r.seq());
                }
            }
            65..=79 => {
                let Some(&seq) = model
                    .claimed
                    .iter()
                    .nth(rng.below(model.claimed.len() as u64 + 1) as usize)
                else {
                    continue;
                };
                outbox.ack(seq).expect("ack");
                model.claimed.remove(&seq);
                let payload = model.live.remove(&seq).expect("live");
                model.acked.insert(seq, payload);
            }
            80..=89 => {
                let Some(&seq) = model
                    .claimed
                    .iter()
                    .nth(rng.below(model.claimed.len() as u64 + 1) as usize)
                else {
                    continue;
                };
                outbox.release(seq).expect("release");
                model.claimed.remove(&seq);
            }
            90..=94 => {
                // Operations that must fail, and change nothing.
                let unknown = Seq::from(last_seq.get() + 1 + rng.below(10));
                assert!(
                    matches!(outbox.ack(unknown), Err(Error::UnknownSeq { .. })),
                    "{}",
                    ctx()
                );
                if let Some(&seq) = model.pending().next() {
                    assert!(
                        matches!(outbox.ack(seq), Err(Error::NotClaimed { .. })),
                        "{}",
                        ctx()
                    );
                    assert!(
                        matches!(outbox.release(seq), Err(Error::NotClaimed { .. })),
                        "{}",
                        ctx()
                    );
                }
            }
            _ => {
                outbox.close().expect("close");
                outbox = Outbox::open(&dir, options()).expect("reopen");
                // Every record not acknowledged comes back, intact and in order;
                // an acknowledged one only if its segment was still on disk.
                let mut back = Vec::new();
                loop {
                    let got = outbox.claim(64).expect("claim");
                    if got.is_empty() {
                        break;
                    }
                    back.extend(got);
                }
                let seqs: Vec<Seq> = back.iter().map(|r| r.seq()).collect();
                assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{}", ctx());
                let returned: BTreeSet<Seq> = seqs.iter().copied().collect();
                for seq in model.live.keys() {
                    assert!(returned.contains(seq), "{}: record {seq} lost", ctx());
                }
                for r in &back {
                    let expected = model.live.get(&r.seq()).or(model.acked.get(&r.seq()));
                    assert_eq!(
                        Some(&r.payload().to_vec()),
                        expected,
                        "{}: seq {}",
                        ctx(),
                        r.seq()
                    );
                }
                // From now on every returned record is live again, and released.
                for r in &back {
                    if let Some(p) = model.acked.remove(&r.seq()) {
                        model.live.insert(r.seq(), p);
                    }
                    outbox.release(r.seq()).expect("release");
                }
                model.claimed.clear();
                model.acked.clear();
            }
        }
        let stats = outbox.stats();
        assert_eq!(
            stats.pending,
            model.pending().count() as u64,
            "{}: pending",
            ctx()
        );
        assert_eq!(
            stats.claimed,
            model.claimed.len() as u64,
            "{}: claimed",
            ctx()
        );
    }
    outbox.close().expect("close");
}

#[test]
fn random_operations_agree_with_the_model() {
    for seed in 1..=24 {
        run(seed, 400);
    }
}
