// Package idem stores idempotency keys in an embedded Pebble database so that
// a retried API write runs once.
//
// # The contract
//
// A client names one logical operation with an idempotency key and sends it
// on every retry. The server claims the key's Scope (tenant, endpoint, key)
// together with a Fingerprint of the canonical request. The first claim gets
// a Lease and runs the operation; a claim of a completed key with the same
// fingerprint gets the stored Record to replay; a claim while the operation
// runs gets ErrInProgress with a retry hint; the same key with another
// request gets ErrFingerprintMismatch; an earlier attempt whose outcome is
// unknown gets ErrOutcomePending. The idemhttp package speaks this contract
// over HTTP, and idemclient is its client half.
//
// # Durability
//
// Every change of state is synced to the write-ahead log before the call
// that made it returns: the claim before the operation may run, the
// completion before the response may be sent. Concurrent writers share
// syncs through a group commit, and each keeps its key's stripe lock until
// its own write is durable, so nobody reads a claim that a crash could
// still take back. A failure to write, sync or close the log, to create
// the next one or to sync the directory that holds them ends the process
// with exit status 74 and a line on standard error naming the failed
// operation: carrying on could acknowledge a write that is not on disk.
// Only while Open runs and once Close has begun, when nothing acknowledged
// depends on the log, is such a failure returned instead. A failure to
// write, sync or close a blob file (where flushes and compactions put
// values of a few hundred bytes or more) ends the process the same way at
// any time, a full disk included: Pebble crashes on some of these failures,
// and they cannot be told apart. Nothing is lost, as the log or the
// compaction's input files still hold those values.
//
// Most claims are of keys never seen. A Bloom filter over every stored key,
// rebuilt in the background as the store grows, answers those from memory
// instead of searching Pebble. It takes 4 to 8 bytes of memory per record,
// twice that while a rebuild runs, and until its first build after Open
// every read goes to Pebble.
//
// # Crashes and unknown outcomes
//
// A crash leaves claims in progress. They are never re-run on their own and
// never turned into a made-up success: once their lease runs out, DB.Overdue
// lists them, Options.Reconcile gets a lease on each to record what really
// happened, and until then a retry gets ErrOutcomePending. DownstreamKey
// gives the deterministic key to forward to a payment provider, so that a
// reconciler asking again is deduplicated there too.
//
// # Operating a store
//
// Records lists what is stored, by tenant, endpoint, state and age, and
// TakeOver gives a person or a tool a lease on a stuck record (in progress
// past its lease, unknown, failed) to settle it: never on a completed one,
// never while a live lease may still be at work. Options.Events receives one
// structured event per state transition, carrying a hash of the key rather
// than the key. Metrics and Ping feed dashboards and health checks. Check
// reads the whole store and reports every record, index entry or body chunk
// that breaks the invariants between them, as Problems with stable kinds.
// The idem command wraps all of this for people.
//
// # Expiry
//
// Records expire after Options.TTL (per endpoint with Options.EndpointTTL).
// Expired records read as absent at once; the sweeper in package
// compaction deletes them with their index entries and body chunks, then
// compacts the cleared spans so the disk shrinks again.
//
// # Canonical requests
//
// Request.Fingerprint hashes method, path, tenant, media type and the
// canonical body: JSON members sorted, whitespace dropped, numbers compared
// by exact decimal value, volatile members left out. Two re-serializations
// of one request share a fingerprint; two different amounts never do.
package idem
