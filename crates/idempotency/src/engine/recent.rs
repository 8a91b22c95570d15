//! The answers this process gave or replayed lately, held in its memory and checked before the
//! replay cache and the records: a retry that lands on the instance that answered it is served
//! without a network round trip.
//!
//! Only final answers are held (a completed record's response never changes until the record
//! expires), each until its record's `expires_at` by this process's clock, as the replay cache
//! holds them. Whatever the keys, the memory held stays within a capacity in bytes: when a new
//! answer does not fit, answers go, the oldest of the tenant that holds the most first, so a
//! tenant sending new keys without end pushes out its own answers, not another's. Losing an
//! answer costs a round trip, never correctness: the replay cache and the records still have
//! it.
//!
//! The bytes counted are what the answers take from the heap, within a few per cent: every
//! allocation an answer owns (its key, held twice, its headers and body) as the allocator
//! rounds it, and the tables that hold them (the map's and the queues' slots, with the room
//! they keep free to grow). A map that doubles its slots makes room by letting answers go, as
//! a larger answer would (`tests/recent_answers_memory.rs` in the api crate measures the heap
//! filled to the capacity).
//!
//! An answer also holds the [`Verbatim`] digest of the last request judged the same as the
//! one it answered: a retry sent byte for byte as that one is answered before it is even
//! parsed ([`get_verbatim`](RecentAnswers::get_verbatim)).

use std::collections::{HashMap, VecDeque};
use std::mem::size_of;
use std::sync::{Mutex, MutexGuard};

use chrono::{DateTime, Utc};

use super::ports::CachedReplay;
use crate::{IdempotencyKey, Scope, Verbatim};

/// Recent final answers, bounded by [`capacity`](Self::capacity) bytes.
#[derive(Debug)]
pub struct RecentAnswers {
    capacity: usize,
    held: Mutex<Held>,
}

/// How much is held: for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecentAnswersHeld {
    pub entries: usize,
    pub bytes: usize,
}

type Slot = (Scope, IdempotencyKey);

#[derive(Debug, Default)]
struct Held {
    /// Boxed, so that a slot the map keeps free to grow costs a pointer, not a whole entry.
    entries: HashMap<Slot, Box<Entry>>,
    /// What each tenant holds. A tenant is one of the service's principals, so they are few.
    tenants: HashMap<String, TenantHeld>,
    /// What the entries' own allocations take: the sum of their `size`s. The tables are
    /// counted as they are ([`tables`](Self::tables)).
    owned: usize,
    next: u64,
}

#[derive(Debug, Default)]
struct TenantHeld {
    /// What its entries' own allocations take.
    bytes: usize,
    entries: usize,
    /// The tenant's slots in the order they were put, each with the number it was put under:
    /// a number that no longer matches its entry's was replaced or removed since, and is
    /// skipped.
    order: VecDeque<(u64, Slot)>,
}

#[derive(Debug)]
struct Entry {
    put: u64,
    /// What its own allocations take ([`owned_bytes`]).
    size: usize,
    replay: CachedReplay,
    /// The request, as sent, last judged the same as the one `replay` answers.
    verbatim: Option<Verbatim>,
}

impl RecentAnswers {
    /// Holds at most `capacity` bytes of answers.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            held: Mutex::new(Held::default()),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn held(&self) -> MutexGuard<'_, Held> {
        // A panic while holding the lock cannot leave `Held` inconsistent in a way that
        // matters more than losing answers, which is always allowed.
        self.held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The answer held for `key`, unless it expired by `now`.
    pub fn get(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        now: DateTime<Utc>,
    ) -> Option<CachedReplay> {
        let mut held = self.held();
        let slot = (scope.clone(), key.clone());
        let entry = held.entries.get(&slot)?;
        if entry.replay.expires_at <= now {
            held.remove(&slot);
            return None;
        }
        Some(entry.replay.clone())
    }

    /// The answer held for `key`, unless it expired by `now`, if `verbatim` is the request
    /// last [vouched](Self::vouch) for it: the same bytes are the same request.
    pub fn get_verbatim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        verbatim: &Verbatim,
        now: DateTime<Utc>,
    ) -> Option<CachedReplay> {
        let held = self.held();
        let entry = held.entries.get(&(scope.clone(), key.clone()))?;
        (entry.verbatim.as_ref() == Some(verbatim) && entry.replay.expires_at > now)
            .then(|| entry.replay.clone())
    }

    /// Notes that `verbatim` was judged the same request as the one the answer of `generation`
    /// held for `key` answers (its fingerprint compared, or it made the answer); nothing if
    /// another answer is held for `key` by now.
    pub fn vouch(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        generation: uuid::Uuid,
        verbatim: Verbatim,
    ) {
        let mut held = self.held();
        if let Some(entry) = held.entries.get_mut(&(scope.clone(), key.clone()))
            && entry.replay.generation == generation
        {
            entry.verbatim = Some(verbatim);
        }
    }

    /// Holds `replay` for `key`, replacing what was held for it, and lets answers go until
    /// everything fits: the oldest of the tenant holding the most first, this one last of its
    /// tenant's. An answer larger than the whole capacity is not held. Returns how much is held
    /// then.
    pub fn put(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        replay: CachedReplay,
    ) -> RecentAnswersHeld {
        let slot = (scope.clone(), key.clone());
        let size = owned_bytes(&slot, &replay);
        let mut held = self.held();
        if size > self.capacity {
            return held.totals();
        }
        if held
            .entries
            .get(&slot)
            .is_some_and(|entry| entry.replay.generation == replay.generation)
        {
            return held.totals();
        }
        held.remove(&slot);
        let put = held.next;
        held.next += 1;
        held.owned += size;
        let tenant = held.tenants.entry(scope.tenant.clone()).or_default();
        tenant.bytes += size;
        tenant.entries += 1;
        tenant.order.push_back((put, slot.clone()));
        held.entries.insert(
            slot,
            Box::new(Entry {
                put,
                size,
                replay,
                verbatim: None,
            }),
        );
        held.compact(&scope.tenant);
        // Room is made only now, as the tables may have grown to take the answer. The last
        // answer to go takes the tables with it.
        while held.bytes() > self.capacity && held.remove_oldest_of_the_largest() {}
        held.totals()
    }

    /// Lets go of the answer held for `key`: its record was replaced. Returns how much is held
    /// then.
    pub fn forget(&self, scope: &Scope, key: &IdempotencyKey) -> RecentAnswersHeld {
        let mut held = self.held();
        held.remove(&(scope.clone(), key.clone()));
        held.totals()
    }

    pub fn held_now(&self) -> RecentAnswersHeld {
        self.held().totals()
    }
}

impl Held {
    fn totals(&self) -> RecentAnswersHeld {
        RecentAnswersHeld {
            entries: self.entries.len(),
            bytes: self.bytes(),
        }
    }

    /// What everything held takes from the heap.
    fn bytes(&self) -> usize {
        self.owned + self.tables()
    }

    /// What the map of entries, the tenants and their queues take, each as large as it has
    /// grown: their free room counts, and stays until they are let go.
    fn tables(&self) -> usize {
        let queues: usize = self
            .tenants
            .iter()
            .map(|(tenant, held)| {
                allocated(tenant.capacity())
                    + allocated(held.order.capacity() * size_of::<(u64, Slot)>())
            })
            .sum();
        table_bytes::<(Slot, Box<Entry>)>(self.entries.capacity())
            + table_bytes::<(String, TenantHeld)>(self.tenants.capacity())
            + queues
    }

    fn remove(&mut self, slot: &Slot) {
        let Some(entry) = self.entries.remove(slot) else {
            return;
        };
        self.owned -= entry.size;
        let tenant = &slot.0.tenant;
        if let Some(held) = self.tenants.get_mut(tenant) {
            held.bytes -= entry.size;
            held.entries -= 1;
            if held.entries == 0 {
                self.tenants.remove(tenant);
            }
        }
        if self.entries.is_empty() {
            // Nothing held: the tables go too, and nothing is counted.
            self.entries = HashMap::new();
            self.tenants = HashMap::new();
        }
    }

    /// Lets the oldest answer of the tenant holding the most bytes go; false if none is held.
    fn remove_oldest_of_the_largest(&mut self) -> bool {
        let Some(largest) = self
            .tenants
            .iter()
            .max_by_key(|(_, held)| held.bytes)
            .map(|(tenant, _)| tenant.clone())
        else {
            return false;
        };
        while let Some((put, slot)) = self
            .tenants
            .get_mut(&largest)
            .and_then(|held| held.order.pop_front())
        {
            if self
                .entries
                .get(&slot)
                .is_some_and(|entry| entry.put == put)
            {
                self.remove(&slot);
                return true;
            }
        }
        // Every entry has its place in its tenant's queue.
        false
    }

    /// Drops `tenant`'s stale places once they outnumber its live ones, so that its queue
    /// stays within twice its entries however often answers are replaced or forgotten.
    fn compact(&mut self, tenant: &str) {
        let entries = &self.entries;
        let Some(held) = self.tenants.get_mut(tenant) else {
            return;
        };
        if held.order.len() > 2 * held.entries + 64 {
            held.order
                .retain(|(put, slot)| entries.get(slot).is_some_and(|entry| entry.put == *put));
        }
    }
}

/// What the allocations an entry owns take: the entry itself (the fingerprint, the request as
/// sent and the times among it), its slot's strings, held twice (as the map's key and in its
/// tenant's queue), and its response's headers and body.
fn owned_bytes(slot: &Slot, replay: &CachedReplay) -> usize {
    let (scope, key) = slot;
    // The slot's strings are `put`'s own copies, as long as they read (a key's `capacity` is
    // not to be had).
    let slot = allocated(scope.tenant.capacity())
        + allocated(scope.operation.capacity())
        + allocated(key.as_str().len());
    let response = &replay.response;
    let headers: usize = response
        .headers
        .iter()
        .map(|(name, value)| allocated(name.capacity()) + allocated(value.capacity()))
        .sum();
    allocated(size_of::<Entry>())
        + 2 * slot
        + allocated(response.headers.capacity() * size_of::<(String, String)>())
        + headers
        + allocated(response.body.capacity())
}

/// What the table of a map with room for `capacity` entries of `T` takes: the standard map's
/// (hashbrown's) layout, a power of two of buckets at most 7/8 full (4 or 8 when smaller),
/// each a `T` and a control byte, and a group of 16 control bytes more.
fn table_bytes<T>(capacity: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    let buckets = if capacity < 8 {
        capacity + 1
    } else {
        capacity / 7 * 8
    };
    allocated((buckets * size_of::<T>()).next_multiple_of(16) + buckets + 16)
}

/// What the allocator takes to serve `bytes`: its size class. These are mimalloc's, which the
/// service allocates with: steps of 8 bytes up to 64, then four classes from each power of two
/// to the next (at most 25 %, on average about 10 % more than asked), and past 64 KiB whole
/// 64 KiB slices.
fn allocated(bytes: usize) -> usize {
    const WORD: usize = 8;
    const SLICE: usize = 64 * 1024;
    if bytes == 0 {
        return 0;
    }
    if bytes > SLICE {
        return bytes.next_multiple_of(SLICE);
    }
    let words = bytes.div_ceil(WORD);
    if words <= 8 {
        return words * WORD;
    }
    // A quarter of the power of two below the size, in words.
    let step = 1 << ((words - 1).ilog2() - 2);
    words.next_multiple_of(step) * WORD
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use uuid::Uuid;

    use super::*;
    use crate::{Fingerprint, SchemaVersion, StoredResponse};

    fn scope(tenant: &str) -> Scope {
        Scope {
            tenant: tenant.to_owned(),
            operation: "charges.create".to_owned(),
        }
    }

    fn key(name: &str) -> IdempotencyKey {
        IdempotencyKey::parse(name).unwrap_or_else(|e| panic!("{e}"))
    }

    fn answer(body: usize, expires_at: DateTime<Utc>) -> CachedReplay {
        CachedReplay {
            generation: Uuid::new_v4(),
            fingerprint: Fingerprint::of_json_request(
                "POST",
                "/charges",
                &serde_json::json!({ "amount": 1 }),
            ),
            response: StoredResponse::new(SchemaVersion::new(1), 201, [], vec![b'x'; body]),
            expires_at,
        }
    }

    fn later() -> DateTime<Utc> {
        Utc::now() + Duration::from_secs(3600)
    }

    #[test]
    fn an_answer_is_held_until_its_record_expires_and_not_a_moment_longer() {
        let recent = RecentAnswers::new(1 << 20);
        let expires_at = Utc::now() + Duration::from_secs(10);
        let held = answer(100, expires_at);
        recent.put(&scope("acme"), &key("k1"), held.clone());

        let just_before = expires_at - Duration::from_millis(1);
        assert_eq!(
            recent.get(&scope("acme"), &key("k1"), just_before),
            Some(held)
        );
        assert_eq!(recent.get(&scope("acme"), &key("k1"), expires_at), None);
        assert_eq!(
            recent.held_now(),
            RecentAnswersHeld::default(),
            "the expired answer went"
        );
    }

    #[test]
    fn a_request_as_sent_finds_an_answer_only_once_it_was_vouched_for_that_answer() {
        let recent = RecentAnswers::new(1 << 20);
        let (acme, k1, now) = (scope("acme"), key("k1"), Utc::now());
        let held = answer(10, later());
        let sent = Verbatim::of(&[b"/charges", br#"{"amount":1}"#]);
        recent.put(&acme, &k1, held.clone());
        assert_eq!(
            recent.get_verbatim(&acme, &k1, &sent, now),
            None,
            "not vouched for"
        );

        recent.vouch(&acme, &k1, Uuid::new_v4(), sent);
        assert_eq!(
            recent.get_verbatim(&acme, &k1, &sent, now),
            None,
            "vouched for another answer"
        );

        recent.vouch(&acme, &k1, held.generation, sent);
        assert_eq!(
            recent.get_verbatim(&acme, &k1, &sent, now),
            Some(held.clone())
        );
        let respelled = Verbatim::of(&[b"/charges", br#"{ "amount": 1 }"#]);
        assert_eq!(
            recent.get_verbatim(&acme, &k1, &respelled, now),
            None,
            "other bytes are judged by their fingerprint"
        );
        assert_eq!(recent.get_verbatim(&scope("globex"), &k1, &sent, now), None);
        assert_eq!(
            recent.get_verbatim(&acme, &k1, &sent, held.expires_at),
            None,
            "not after the record expires"
        );

        recent.put(&acme, &k1, answer(10, later()));
        assert_eq!(
            recent.get_verbatim(&acme, &k1, &sent, now),
            None,
            "a new answer for the key is vouched for afresh"
        );
    }

    #[test]
    fn an_allocation_is_counted_as_the_size_class_that_serves_it() {
        for (asked, served) in [
            (0, 0),
            (1, 8),
            (36, 40),
            (64, 64),
            (65, 80),
            (100, 112),
            (330, 384),
            (600, 640),
            (4096, 4096),
            (4097, 5120),
            (70_000, 131_072),
        ] {
            assert_eq!(allocated(asked), served, "{asked} bytes");
        }
    }

    #[test]
    fn an_answer_counts_its_key_twice_its_headers_and_body_and_its_slots() {
        let recent = RecentAnswers::new(1 << 20);
        let mut held = answer(300, later());
        held.response.headers = vec![("location".to_owned(), "/charges/ch_1".to_owned())];
        recent.put(&scope("acme"), &key("k1"), held);
        let owned = allocated(size_of::<Entry>()) + 2 * (8 + 16 + 8) + 48 + (8 + 16) + 320;
        let tables = table_bytes::<(Slot, Box<Entry>)>(3)
            + table_bytes::<(String, TenantHeld)>(3)
            + 8
            + allocated(4 * size_of::<(u64, Slot)>());
        assert_eq!(recent.held_now().bytes, owned + tables);
    }

    #[test]
    fn the_room_the_tables_keep_free_is_counted_until_the_last_answer_goes() {
        let recent = RecentAnswers::new(1 << 20);
        let one = recent.put(&scope("acme"), &key("k0"), answer(10, later()));
        for i in 1..100 {
            recent.put(&scope("acme"), &key(&format!("k{i}")), answer(10, later()));
        }
        for i in 1..100 {
            recent.forget(&scope("acme"), &key(&format!("k{i}")));
        }
        let grown = recent.held_now();
        assert_eq!(grown.entries, 1);
        assert!(
            grown.bytes > one.bytes + 100 * size_of::<(Slot, Box<Entry>)>(),
            "one answer in tables grown for a hundred: {} bytes, {} in fresh ones",
            grown.bytes,
            one.bytes
        );

        recent.forget(&scope("acme"), &key("k0"));
        assert_eq!(recent.held_now(), RecentAnswersHeld::default());
    }

    #[test]
    fn an_answer_is_found_only_under_its_own_tenant_and_key() {
        let recent = RecentAnswers::new(1 << 20);
        recent.put(&scope("acme"), &key("k1"), answer(10, later()));
        assert!(
            recent
                .get(&scope("globex"), &key("k1"), Utc::now())
                .is_none()
        );
        assert!(recent.get(&scope("acme"), &key("k2"), Utc::now()).is_none());
        assert!(recent.get(&scope("acme"), &key("k1"), Utc::now()).is_some());
    }

    #[test]
    fn the_bytes_held_never_exceed_the_capacity_and_the_oldest_go_first() {
        let capacity = 64 * 1024;
        let recent = RecentAnswers::new(capacity);
        for i in 0..1_000 {
            recent.put(&scope("acme"), &key(&format!("k{i}")), answer(900, later()));
            assert!(recent.held_now().bytes <= capacity, "after {i} puts");
        }
        let held = recent.held_now().entries;
        assert!(held > 10, "it holds what fits: {held}");
        let now = Utc::now();
        assert!(
            recent.get(&scope("acme"), &key("k999"), now).is_some(),
            "the newest stays"
        );
        assert!(
            recent.get(&scope("acme"), &key("k0"), now).is_none(),
            "the oldest went"
        );
        assert!(
            recent
                .get(&scope("acme"), &key(&format!("k{}", 999 - held)), now)
                .is_none()
        );
        assert!(
            recent
                .get(&scope("acme"), &key(&format!("k{}", 1_000 - held)), now)
                .is_some()
        );
    }

    #[test]
    fn a_tenant_sending_new_keys_without_end_pushes_out_its_own_answers_not_anothers() {
        let recent = RecentAnswers::new(64 * 1024);
        for i in 0..5 {
            recent.put(
                &scope("globex"),
                &key(&format!("g{i}")),
                answer(900, later()),
            );
        }
        for i in 0..10_000 {
            recent.put(&scope("acme"), &key(&format!("a{i}")), answer(900, later()));
        }
        let now = Utc::now();
        for i in 0..5 {
            assert!(
                recent
                    .get(&scope("globex"), &key(&format!("g{i}")), now)
                    .is_some(),
                "globex's answer g{i} is still held"
            );
        }
        assert!(recent.get(&scope("acme"), &key("a9999"), now).is_some());
        assert!(recent.get(&scope("acme"), &key("a0"), now).is_none());
        assert!(recent.held_now().bytes <= 64 * 1024);
    }

    #[test]
    fn an_answer_larger_than_the_capacity_is_not_held() {
        let recent = RecentAnswers::new(4096);
        recent.put(&scope("acme"), &key("k1"), answer(10, later()));
        recent.put(&scope("acme"), &key("big"), answer(8192, later()));
        assert!(
            recent
                .get(&scope("acme"), &key("big"), Utc::now())
                .is_none()
        );
        assert!(
            recent.get(&scope("acme"), &key("k1"), Utc::now()).is_some(),
            "nothing evicted for it"
        );
    }

    #[test]
    fn a_forgotten_or_replaced_answer_is_gone_and_the_queue_stays_bounded() {
        let recent = RecentAnswers::new(1 << 20);
        for _ in 0..10_000 {
            recent.put(&scope("acme"), &key("k1"), answer(10, later()));
        }
        let replaced = answer(10, later());
        recent.put(&scope("acme"), &key("k1"), replaced.clone());
        assert_eq!(
            recent.get(&scope("acme"), &key("k1"), Utc::now()),
            Some(replaced)
        );
        assert_eq!(recent.held_now().entries, 1);
        let queued = recent.held().tenants["acme"].order.len();
        assert!(queued <= 2 * 4 + 64, "stale places are dropped: {queued}");

        recent.forget(&scope("acme"), &key("k1"));
        assert!(recent.get(&scope("acme"), &key("k1"), Utc::now()).is_none());
        assert_eq!(recent.held_now(), RecentAnswersHeld::default());
    }
}
