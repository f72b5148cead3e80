// Package pgstore keeps idempotency records in PostgreSQL, so that many
// replicas of a service share them: a key claimed on one replica is in
// progress on all of them, and a response stored by one is replayed by
// all. It implements idem.Operator and passes the same conformance
// suite (idemtest.TestStore) as the embedded store of package idem.
//
// # Basics
//
// Open connects, brings the schema up to date and returns a *Store:
//
//	s, err := pgstore.Open(ctx, "postgres://app@db/app", nil)
//	...
//	defer s.Close()
//	l, rec, err := s.Claim(ctx, scope, fingerprint)
//
// The records live in one table, idempotency_keys, with one row per
// (tenant, endpoint, key): the fingerprint, the state, the stored
// response, the lease (token and end), the attempt count and the
// creation, update and expiry times. The schema is applied by numbered
// migrations recorded in idem_schema_migrations; Options.Migrate can
// forbid Open to apply them. Both tables live in the PostgreSQL schema
// Options.Schema names, and every statement qualifies them with it.
//
// # Guarantees
//
// The primary key is the concurrency control. A claim runs up to two of
// three statements: an INSERT ... ON CONFLICT DO NOTHING for a new key, a
// read of the live row, at which a replay or a refusal ends having
// written and locked nothing, and an INSERT ... ON CONFLICT DO UPDATE
// that takes over a row only once it has expired. So of any number of
// callers on any number of replicas exactly one wins a fresh or expired
// key; a caller that meets a row committed since its read reads again.
// Which goes first follows the store's recent claims: the first insert
// while most keys were new, the read while most met a row (a retry
// storm), so that each case costs one statement when it is the usual one. Every lease
// call names the lease's token in its WHERE: a holder whose record was
// taken over, released or expired changes nothing and gets
// idem.ErrLeaseLost. Completed responses and fingerprints are never
// overwritten.
//
// Each end of a lease (complete, release, mark, take-over) sends a
// NOTIFY in the same statement or transaction when the record says that
// someone waits: Wait marks the record before it sleeps, so the many ends
// nobody waits for skip the notification, whose commit PostgreSQL
// serialises across the whole server. Each Store keeps one
// connection that LISTENs and wakes the waiters of the scope named; if
// that connection is lost, waiters re-read their records every half
// second until it is back.
//
// Reconcile takes overdue records one at a time with FOR UPDATE SKIP
// LOCKED, so replicas reconciling at once never hand one record to two
// reconcilers. Sweep deletes expired records a thousand per statement,
// one replica at a time (an advisory lock).
//
// # Transactions
//
// When the operation writes to the same database, InTx runs it in one
// transaction with its claim and its completion:
//
//	resp, replayed, err := s.InTx(ctx, scope, fingerprint, func(ctx context.Context, tx pgx.Tx) (idem.Response, error) {
//		_, err := tx.Exec(ctx, "INSERT INTO payments ...")
//		return idem.Response{Status: 201, Body: body}, err
//	})
//
// The operation's rows and the completed record then commit together or
// not at all: nobody ever finds the operation done and its key in
// progress, and a rollback (fn's error or panic, a failed commit) leaves
// the key free for a retry. ClaimTx does the same in a transaction the
// caller manages. Until the transaction ends its claim is invisible, and
// PostgreSQL makes a concurrent claim of the same key wait for it: that
// claim then gets the replay after a commit, or the key after a rollback.
// The wait is bounded by Options.ClaimWait (2 seconds by default), past
// which the claim gets ErrInProgress. Wait does not see such a claim and
// returns at once; notifications of the transaction go out at its commit.
//
// # Outages
//
// While the database is down or a connection breaks, calls fail with an
// error (never a *idem.KeyError), within their context; over HTTP,
// idemhttp answers 503 store_unavailable and runs no handler. A claim
// whose connection broke before its commit was confirmed is an error too,
// though it may have committed: a retry then finds the key in progress
// and, once its lease ends, pending reconciliation, so the operation
// never runs twice. The pool and the listener reconnect by themselves once
// the server is back, and no call fails then for a connection that died
// while idle: the pool turns away a connection the server has closed
// before writing to it (one non-blocking read), and a statement that pgx
// says was never sent runs once more on a fresh connection. A write the
// server refuses as read-only (SQLSTATE 25006: a primary demoted, with
// target_session_attrs=read-write in the DSN to find the new one) is an
// outage too: it empties the pool and runs once more on a fresh
// connection. A statement that may have reached a server that takes
// writes is never run again.
//
// # Time and clocks
//
// Every time the store writes or compares comes from Options.Now on the
// replica that makes the call, never from the database server. Clocks
// that differ between replicas move the ends of leases and records: a
// replica whose clock runs d ahead of the one that claimed sees the lease
// end, and the record expire, d early. Taken early, a lease would answer
// outcome_pending or reach a reconciler while its holder still works
// (the holder then gets ErrLeaseLost and its outcome is not stored), and
// an early expiry would let a late retry run the operation again.
//
// Options.ClockSkew bounds this: each lease and each record is stored as
// lasting ClockSkew longer than Options.Lease and the TTL, so as long as
// no two replicas' clocks differ by more than ClockSkew, none ends a lease
// before Lease, or a record before its TTL, has passed on the claimant's
// clock. The price is that an abandoned claim reaches reconciliation, and
// a record leaves, ClockSkew later. The default of one second is far
// above what NTP keeps clocks to. Open warns when the replica's clock is
// off from the database server's by more than half of ClockSkew (replicas
// each within half of it of the server are within ClockSkew of each
// other), and Metrics reports the offset as idem_pg_clock_offset_seconds,
// to alert on. Times are stored to the microsecond.
//
// # Limits
//
// The tenant, endpoint and key are stored as text: a scope that is not
// valid UTF-8 or holds a NUL byte is refused with idem.ErrInvalidScope. Response headers are stored as JSON, so header values that are
// not valid UTF-8 come back with replacement characters. Errors from the
// database are returned wrapped ("pgstore: claim: ..."); none repeats
// the DSN.
package pgstore
