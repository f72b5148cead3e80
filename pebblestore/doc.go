// Package pebblestore is idem's embedded store: it keeps idempotency keys
// in a Pebble database inside your process, so that an operation a client
// retries runs once, with no database server to run.
//
// # Basics
//
// Open a store with Open and keep the *Store for the life of the process.
// Name each operation with an idem.Scope (tenant, endpoint, the client's
// key) and an idem.Fingerprint of its canonical request, then either let
// idem.Do run it once and record what it returns, or drive the claim by
// hand:
//
//	lease, replay, err := store.Claim(ctx, scope, fp)
//
// The first claim of a key gets a Lease: run the operation, then Complete
// the lease with its Response (or Release it when nothing happened, or
// MarkUnknown it when something may have). A repeat of a completed key
// gets the stored Record to replay. A repeat while the operation runs gets
// idem.ErrInProgress, the same key with another request
// idem.ErrFingerprintMismatch, and a key whose earlier outcome is unknown
// idem.ErrOutcomePending, each in an *idem.KeyError.
//
// Those words, and the idem.Store and idem.Operator interfaces that *Store
// implements, belong to package idem, the contract every backend shares;
// pgstore is the same contract on PostgreSQL and idemtest's MemStore the
// same in memory.
//
// # Durability
//
// Every change of state is synced to Pebble's write-ahead log before the
// call that made it returns: the claim before the operation may run, the
// completion before the response may be sent. Concurrent writers share one
// sync. A failure to write or sync the log, or a blob file, while the
// store is live ends the process with exit status 74 and a line naming the
// failed operation, since carrying on could acknowledge a write that is
// not on disk. A full disk during a flush or compaction ends it the same
// way; what was acknowledged is still in the log or in the compaction's
// input, and the store opens again once there is room.
//
// # Crashes and unknown outcomes
//
// A crash leaves claims in progress. They are never re-run on their own and
// never turned into a made-up success: once their lease runs out, Overdue
// lists them, Options.Reconcile gets a lease on each to record what really
// happened, and until then a retry gets ErrOutcomePending. DownstreamKey
// gives the deterministic key to forward to a payment provider, so that a
// reconciler asking again is deduplicated there too.
//
// # Operating a store
//
// Records lists what is stored, TakeOver gives a person or a tool a lease
// on a stuck record (never on a completed one, never while a live lease may
// still be at work), Metrics counts every Event, and Options.Events logs
// each one with a hash of the key rather than the key. Check reads the
// whole store and reports every record, index entry or body chunk that
// breaks the invariants between them, as Problems with stable kinds. The
// idem command wraps all of this for people.
//
// # Expiry
//
// Records expire after Options.TTL (per endpoint with Options.EndpointTTL).
// Expired records read as absent at once; a background sweep deletes them
// with their index entries and body chunks and compacts the cleared spans
// so the disk shrinks again. Over HTTP, package idemhttp gives each stored
// answer and each replay an Idempotency-Key-Expires header, the record's
// ExpiresAt as an HTTP-date, so that clients learn the window at run time.
//
// # Time and clocks
//
// Every time a record holds comes from Options.Now. A clock that is
// behind (a device without a battery-backed clock starts in 1970 until
// the network is up; time synchronisation also steps clocks back) would
// write records that expire, and leases that end, early once the clock is
// put right, and a retry would then run the operation again. So the store
// keeps a clock mark, the newest clock reading it has written under,
// durably with the writes it syncs anyway, and while the clock reads
// further behind the mark than Options.ClockTolerance (5 seconds by
// default), Claim and TakeOver fail with ErrClockBehind and store nothing.
// Each refusal counts as the clock_behind event (idem_clock_behind_total),
// the first of a run of them is logged with how far behind the clock is,
// and idemhttp answers 503 clock_behind with Retry-After. Leases already
// granted still store their outcome; reads, sweeps and reconciliation go
// by the clock as it reads. Fix the clock and claims resume by
// themselves. The mark only moves forward, so a mark that a clock wrongly
// ahead left behind holds claims back until the clock passes it.
//
// A clock that jumps ahead expires records early, and the sweep then
// deletes them: nothing tells such a jump from a store left idle, so the
// sweep logs once when the clock is past the expiry of everything written
// up to the mark. Start the service once the clock is right.
package pebblestore
