//! Random interleavings of `append_message` (keys, not-before times,
//! deduplication ids), claims, acknowledgements, releases with and without a
//! delay, dead letters, requeues, discards and reopens, checked against a
//! small model of what the outbox promises: claims exactly as the model
//! predicts, duplicates and conflicts as it predicts, quotas as it predicts.

use std::collections::BTreeMap;
use std::time::Duration;

use segwal::sim::Rng;
use segwal::{Error, Message, Options, Outbox, Seq};

use crate::tmp;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    Pending,
    Claimed,
    /// Released with a delay, or appended with a not-before time: an hour,
    /// which never passes in a run.
    Delayed,
    Dead,
}

#[derive(Debug)]
struct Rec {
    payload: Vec<u8>,
    key: Option<u8>,
    st: St,
    /// Delayed by `release_after` (it had its key's turn when released, and
    /// keeps it, across reopens too, while it waits).
    released: bool,
}

/// What the outbox must do.
#[derive(Default)]
struct Model {
    /// Records not acknowledged.
    live: BTreeMap<Seq, Rec>,
    /// Each key's turn: the one record of the key that may be pending,
    /// claimed or delayed.
    turn: BTreeMap<u8, Seq>,
    /// Each deduplication id's record and payload.
    ids: BTreeMap<u8, (Seq, Vec<u8>)>,
}

const QUOTA: u64 = 30;

impl Model {
    fn claimable(&self) -> impl Iterator<Item = Seq> + '_ {
        self.live.iter().filter_map(|(s, r)| {
            let turn = r.key.is_none_or(|k| self.turn.get(&k) == Some(s));
            (r.st == St::Pending && turn).then_some(*s)
        })
    }

    /// The oldest record of `key` still to deliver (not a dead letter).
    fn oldest(&self, key: u8) -> Option<Seq> {
        self.live
            .iter()
            .find(|(_, r)| r.key == Some(key) && r.st != St::Dead)
            .map(|(s, _)| *s)
    }

    /// `seq` leaves its key's queue (acknowledged or dead): the turn passes.
    fn leave(&mut self, seq: Seq) {
        let Some(key) = self.live.get(&seq).and_then(|r| r.key) else {
            return;
        };
        if self.turn.get(&key) == Some(&seq) {
            match self.oldest_except(key, seq) {
                Some(next) => self.turn.insert(key, next),
                None => self.turn.remove(&key),
            };
        }
    }

    fn oldest_except(&self, key: u8, except: Seq) -> Option<Seq> {
        self.live
            .iter()
            .find(|(s, r)| **s != except && r.key == Some(key) && r.st != St::Dead)
            .map(|(s, _)| *s)
    }

    /// `seq`, holding its key's turn, is pending again: an older record of
    /// the key waiting takes the turn.
    fn repass(&mut self, seq: Seq) {
        let Some(key) = self.live[&seq].key else {
            return;
        };
        if let Some(oldest) = self.oldest(key)
            && oldest < seq
            && self.turn.get(&key) == Some(&seq)
        {
            self.turn.insert(key, oldest);
        }
    }

    fn claimed(&self) -> Vec<Seq> {
        self.with(St::Claimed)
    }

    fn with(&self, st: St) -> Vec<Seq> {
        self.live
            .iter()
            .filter(|(_, r)| r.st == st)
            .map(|(s, _)| *s)
            .collect()
    }
}

fn pick(rng: &mut Rng, seqs: &[Seq]) -> Option<Seq> {
    (!seqs.is_empty()).then(|| seqs[rng.below(seqs.len() as u64) as usize])
}

fn run(seed: u64, steps: usize) {
    let (_t, dir) = tmp();
    let options = || {
        Options::default()
            .segment_bytes(8192)
            .lease(Duration::from_secs(3600))
            .max_backlog_records(QUOTA)
    };
    let mut rng = Rng::new(seed);
    let mut outbox = Outbox::open(&dir, options()).expect("open");
    let mut m = Model::default();
    let hour = Duration::from_secs(3600);
    for step in 0..steps {
        let ctx = format!("seed {seed} step {step}");
        match rng.below(100) {
            0..=39 => {
                let key = rng.chance(60).then(|| rng.below(3) as u8);
                let delayed = rng.chance(8);
                let id = rng.chance(25).then(|| rng.below(5) as u8);
                let known = id.and_then(|d| m.ids.get(&d).cloned());
                let payload = match &known {
                    Some((_, p)) if rng.chance(70) => p.clone(),
                    _ => format!("{seed}/{step}").into_bytes(),
                };
                let k = key.map(|k| [b'k', k]);
                let d = id.map(|d| [b'd', d]);
                let mut msg = Message::new(&payload);
                if let Some(k) = &k {
                    msg = msg.key(k);
                }
                if let Some(d) = &d {
                    msg = msg.dedup_id(d);
                }
                if delayed {
                    msg = msg.delay(hour);
                }
                let got = outbox.append_message(&msg);
                match (&known, got) {
                    (Some((seq, p)), Ok(a)) => {
                        assert_eq!(p, &payload, "{ctx}: answered for another payload");
                        assert!(a.duplicate && a.seq == *seq, "{ctx}: {a:?}");
                    }
                    (Some((seq, p)), Err(Error::Conflict { existing, dedup_id })) => {
                        assert_ne!(p, &payload, "{ctx}: the same payload conflicts");
                        assert_eq!(
                            (existing, dedup_id),
                            (*seq, d.expect("id").to_vec()),
                            "{ctx}"
                        );
                    }
                    (None, Ok(a)) => {
                        assert!(!a.duplicate, "{ctx}: a new id or none is a duplicate");
                        assert!((m.live.len() as u64) < QUOTA, "{ctx}: over the quota");
                        let st = if delayed { St::Delayed } else { St::Pending };
                        if let Some(k) = key
                            && !m.turn.contains_key(&k)
                        {
                            m.turn.insert(k, a.seq);
                        }
                        m.live.insert(
                            a.seq,
                            Rec {
                                payload: payload.clone(),
                                key,
                                st,
                                released: false,
                            },
                        );
                        if let Some(d) = id {
                            m.ids.insert(d, (a.seq, payload));
                        }
                    }
                    (None, Err(Error::QuotaExceeded { current, .. })) => {
                        assert_eq!(current, m.live.len() as u64, "{ctx}");
                        assert!(
                            m.live.len() as u64 >= QUOTA,
                            "{ctx}: refused below the quota"
                        );
                    }
                    (k, other) => panic!("{ctx}: known {k:?}, got {other:?}"),
                }
            }
            40..=59 => {
                let max = 1 + rng.below(6) as usize;
                let want: Vec<Seq> = m.claimable().take(max).collect();
                let got = outbox.claim(max).expect("claim");
                let seqs: Vec<Seq> = got.iter().map(|r| r.seq()).collect();
                assert_eq!(seqs, want, "{ctx}: claim");
                for r in &got {
                    let rec = m.live.get_mut(&r.seq()).expect("live");
                    assert_eq!(r.payload(), rec.payload.as_slice(), "{ctx}");
                    assert_eq!(
                        r.key(),
                        rec.key.map(|k| [b'k', k]).as_ref().map(|k| &k[..]),
                        "{ctx}"
                    );
                    rec.st = St::Claimed;
                }
            }
            60..=69 => {
                if let Some(seq) = pick(&mut rng, &m.claimed()) {
                    outbox.ack(seq).expect("ack");
                    m.leave(seq);
                    m.live.remove(&seq);
                }
            }
            70..=74 => {
                if let Some(seq) = pick(&mut rng, &m.claimed()) {
                    outbox.release(seq).expect("release");
                    m.live.get_mut(&seq).expect("live").st = St::Pending;
                    m.repass(seq);
                }
            }
            75..=78 => {
                if let Some(seq) = pick(&mut rng, &m.claimed()) {
                    outbox
                        .release_after(seq, hour, "later")
                        .expect("release_after");
                    let rec = m.live.get_mut(&seq).expect("live");
                    rec.st = St::Delayed;
                    rec.released = true;
                }
            }
            79..=84 => {
                if let Some(seq) = pick(&mut rng, &m.claimed()) {
                    outbox.dead_letter(seq, "refused").expect("dead_letter");
                    m.leave(seq);
                    m.live.get_mut(&seq).expect("live").st = St::Dead;
                }
            }
            85..=89 => {
                if let Some(seq) = pick(&mut rng, &m.with(St::Dead)) {
                    outbox.requeue(seq).expect("requeue");
                    let key = m.live[&seq].key;
                    m.live.get_mut(&seq).expect("live").st = St::Pending;
                    if let Some(k) = key {
                        match m.turn.get(&k).copied() {
                            None => {
                                m.turn.insert(k, seq);
                            }
                            Some(t) if seq < t && m.live[&t].st == St::Pending => {
                                m.turn.insert(k, seq);
                            }
                            Some(_) => {}
                        }
                    }
                }
            }
            90..=92 => {
                if let Some(seq) = pick(&mut rng, &m.with(St::Dead)) {
                    outbox.discard(seq).expect("discard");
                    m.live.remove(&seq);
                }
            }
            _ => {
                outbox.close().expect("close");
                outbox = Outbox::open(&dir, options()).expect("reopen");
                // Claims do not survive; every key's turn is its record
                // waiting out a release's delay, if it has one (an older
                // record requeued meanwhile waits behind it), else its oldest
                // record still to deliver.
                for r in m.live.values_mut() {
                    if r.st == St::Claimed {
                        r.st = St::Pending;
                    }
                }
                let keys: Vec<u8> = m.live.values().filter_map(|r| r.key).collect();
                m.turn.clear();
                for k in keys {
                    let released = m
                        .live
                        .iter()
                        .find(|(_, r)| r.key == Some(k) && r.st == St::Delayed && r.released)
                        .map(|(s, _)| *s);
                    if let Some(s) = released.or_else(|| m.oldest(k)) {
                        m.turn.insert(k, s);
                    }
                }
            }
        }
        let stats = outbox.stats();
        let delayed = m.with(St::Delayed).len() as u64;
        assert_eq!(stats.delayed, delayed, "{ctx}: delayed");
        assert_eq!(
            stats.dead_letters,
            m.with(St::Dead).len() as u64,
            "{ctx}: dead"
        );
        assert_eq!(stats.claimed, m.claimed().len() as u64, "{ctx}: claimed");
        assert_eq!(
            stats.pending,
            m.claimable().count() as u64,
            "{ctx}: pending"
        );
    }
    outbox.close().expect("close");
}

#[test]
fn producer_fields_agree_with_the_model() {
    for seed in 1..=16 {
        run(seed, 500);
    }
}
