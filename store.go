package idem

import (
	"context"
	"iter"
	"time"
)

// Store is the hot path of the contract, the part every backend
// implements: the embedded store that pebblestore.Open opens, an in-memory one
// for tests (idemtest.NewMemStore), a shared database for many replicas.
// The conformance suite idemtest.TestStore states what each method
// promises; a Store is safe for concurrent use.
type Store interface {
	// Claim tries to take the key in s for an operation with fingerprint
	// fp. The first caller of a fresh key (or of one whose record
	// expired) gets a Lease, and the claim is durable before Claim
	// returns, so the operation may run. A key completed with the same
	// fingerprint returns its Record, body included, for replay.
	// Otherwise Claim returns a *KeyError matching ErrInProgress (retry
	// later), ErrFingerprintMismatch (permanent) or ErrOutcomePending (an
	// earlier attempt must be resolved first). A backend that guards
	// against a clock that is behind refuses with ErrClockBehind and
	// stores nothing. Exactly one of the lease, the record and the error
	// is non-nil.
	Claim(ctx context.Context, s Scope, fp Fingerprint) (Lease, *Record, error)

	// Get returns the live record for s, with its body, or an error
	// matching ErrNotFound. Expired records are absent, even before they
	// are swept.
	Get(ctx context.Context, s Scope) (*Record, error)

	// Wait blocks until the record for s is no longer in progress under a
	// live lease (completed, released, marked, or overdue), or until ctx
	// is done, and then returns ctx's error. It returns at once when
	// there is nothing to wait for. Close wakes every waiter. A caller
	// that got ErrInProgress can Wait briefly and claim again instead of
	// polling.
	Wait(ctx context.Context, s Scope) error

	// Ping reports whether the store can serve reads, for health checks.
	Ping(ctx context.Context) error

	// Close releases the store. Leases still held become unusable
	// (ErrClosed), and their records stay in progress for the next
	// reconciliation. Later calls return the first one's result.
	Close() error
}

// Lease is the right to run one claimed operation and record its outcome.
// Exactly one of Complete, Release, MarkUnknown or MarkFailed ends it;
// Extend keeps it alive during a long operation. Each call checks that the
// record is still this lease's: if a reconciler or an operator resolved or
// took over the record, or the lease ran out and someone else claimed the
// key, the call fails with ErrLeaseLost and changes nothing.
//
// The context passed to each method is checked before any work starts. Pass
// one that outlives the client's request: an outcome that is not recorded
// leaves the record in progress until reconciliation. A Lease is safe for
// concurrent use, though its calls are serialized.
type Lease interface {
	// Scope returns the scope the lease was claimed for.
	Scope() Scope
	// Record returns a copy of the record as this lease last wrote it;
	// its State is zero once the lease released the key.
	Record() Record
	// Complete durably stores resp as the operation's outcome; every
	// later claim with the same fingerprint replays it. A body beyond
	// the store's cap is not kept (Record.BodyOmitted). A response that
	// Response.Check refuses fails with ErrInvalidResponse and changes
	// nothing.
	Complete(ctx context.Context, resp Response) error
	// Release deletes the claim: the operation provably did not commit,
	// so the key is free and a retry runs the operation again.
	Release(ctx context.Context) error
	// MarkUnknown records that the operation may have taken effect but
	// its outcome is not known. Later claims get ErrOutcomePending until
	// someone resolves it; the operation is never run again blindly.
	MarkUnknown(ctx context.Context) error
	// MarkFailed records that the operation is known not to have taken
	// effect while keeping the key spent. Later claims get
	// ErrOutcomePending.
	MarkFailed(ctx context.Context) error
	// Extend pushes the lease's end one store lease from now.
	Extend(ctx context.Context) error
}

// Operator is what tools, dashboards and recovery use beside the hot path:
// listings, take-over of stuck records, reconciliation, expiry and
// metrics. Every backend implements it next to Store.
type Operator interface {
	Store

	// Records returns the records f selects, each with its scope. Bodies
	// too large to keep inside a record may be left out (Response.Body
	// nil, BodyLen set): Get returns one record in full. The sequence
	// ends after yielding an error.
	Records(ctx context.Context, f Filter) iter.Seq2[*Record, error]

	// TakeOver gives the caller a new lease on a record whose earlier
	// attempt is stuck (unknown, failed, or in progress past its lease),
	// so that it can record what really happened. The old lease, if
	// anyone still holds it, gets ErrLeaseLost from then on. It fails with
	// ErrNotFound when there is no live record, ErrCompleted when the
	// record holds a response, and a *KeyError matching ErrInProgress,
	// whose RetryAfter is the rest of the lease, while someone may still
	// run the operation.
	TakeOver(ctx context.Context, s Scope) (Lease, error)

	// Overdue returns up to limit in-progress records whose lease has run
	// out (limit <= 0: all), oldest lease first.
	Overdue(ctx context.Context, limit int) ([]*Record, error)

	// Reconcile hands every overdue record to the store's reconciler,
	// each under a fresh lease, and says what it did.
	Reconcile(ctx context.Context) (ReconcileResult, error)

	// Sweep deletes every record that has expired by now.
	Sweep(ctx context.Context) (SweepResult, error)

	// Compact sweeps like Sweep and then gives the space back to the
	// disk now. progress, when not nil, is called after each step.
	Compact(ctx context.Context, progress func(CompactProgress)) (SweepResult, error)

	// Metrics returns a snapshot of the contract's counters and the
	// backend's own figures.
	Metrics(ctx context.Context) (Metrics, error)
}

// Filter selects records for Operator.Records. Each zero field selects
// everything.
type Filter struct {
	// Tenant keeps one tenant's records, and Endpoint one endpoint's.
	Tenant, Endpoint string
	// State keeps the records in that state.
	State State
	// CreatedBefore keeps the records claimed before it.
	CreatedBefore time.Time
	// Expired keeps the records past their TTL as well, which every other
	// read treats as absent; the sweeper has not deleted them yet.
	Expired bool
}

// Match reports whether f selects rec at now.
func (f Filter) Match(rec *Record, now time.Time) bool {
	return (f.Tenant == "" || rec.Scope.Tenant == f.Tenant) &&
		(f.Endpoint == "" || rec.Scope.Endpoint == f.Endpoint) &&
		(f.State == 0 || rec.State == f.State) &&
		(f.CreatedBefore.IsZero() || rec.CreatedAt.Before(f.CreatedBefore)) &&
		(f.Expired || now.Before(rec.ExpiresAt))
}

// ReconcileResult says what one reconciliation pass did.
type ReconcileResult struct {
	Overdue  int // overdue in-progress records found
	Resolved int // of those, resolved by the reconciler
}

// SweepResult says what one sweep did.
type SweepResult struct {
	Records     int   // expired records deleted
	Bytes       int64 // their stored size, bodies included
	Compactions int   // compactions the backend ran over the cleared space
}

// CompactProgress says how far a Compact has come: Done out of Total
// expired records walked in the "sweep" phase, then parts of the store
// compacted in the "compact" phase.
type CompactProgress struct {
	Phase       string
	Done, Total int64
}

// Metrics is a snapshot of a store's counters. Counts of events are since
// the store was opened (by this process); counts of records are of what is
// stored now. Every backend reports the same fields; what is particular to
// one backend is in Engine.
type Metrics struct {
	// Events counts each Event since the store was opened (by this
	// process), indexed by Event: Events[EventClaimed] is the number of
	// claims that won their key.
	Events [NumEvents]int64

	// Stored records that are not completed.
	InProgress       int64         // in progress, live lease or not
	Overdue          int64         // in progress past their lease
	OldestInProgress time.Duration // age of the oldest in-progress record
	UnknownRecords   int64
	FailedRecords    int64

	// Expired counts the records past their TTL that have not been swept
	// yet. Reads already treat them as absent.
	Expired int64

	// BytesReclaimed is the stored size of the records swept since the
	// store was opened, bodies included.
	BytesReclaimed int64

	// Engine holds the backend's own figures (its disk use, its write
	// batching), named as Prometheus series.
	Engine []Figure
}

// Figure is one of a backend's own measurements.
type Figure struct {
	// Name is the Prometheus series name, e.g. "idem_disk_usage_bytes".
	Name string
	// Help says what it measures.
	Help string
	// Counter reports whether it only grows; otherwise it is a gauge.
	Counter bool
	Value   float64
}

// Figure returns the value of the engine figure called name, and whether
// the backend reports one.
func (m *Metrics) Figure(name string) (float64, bool) {
	for _, f := range m.Engine {
		if f.Name == name {
			return f.Value, true
		}
	}
	return 0, false
}
