package pgstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"time"

	"github.com/idemkv/idem"
)

// Options configure a Store. A nil *Options selects every default, and
// so does the zero value of each field.
type Options struct {
	// Now is the clock. Every time the store writes or compares comes from
	// it, never from the database server, so tests can move time by hand.
	// Default: time.Now.
	Now func() time.Time

	// ClockSkew is the most that the clocks of two replicas may differ.
	// Every lease and every record is stored as lasting this much longer
	// than Lease and the TTL, so that a replica whose clock runs ahead by
	// up to ClockSkew never ends a lease or expires a record early; see
	// the package doc. Default: one second.
	ClockSkew time.Duration

	// Lease is how long a claim is held before it counts as abandoned.
	// Default: 30 seconds.
	Lease time.Duration

	// TTL is how long a record is kept after it is claimed. It must be
	// at least idem.MinTTLLeases leases long. Default: 24 hours.
	TTL time.Duration

	// ClaimWait bounds how long a claim waits for another transaction
	// that claimed the same key with ClaimTx or InTx and has not ended:
	// past it, the claim gets ErrInProgress with a RetryAfter of one
	// second. It is the lock_timeout of the claim's statement alone, rounded
	// down to whole milliseconds (at least one). Default: 2 seconds.
	ClaimWait time.Duration

	// EndpointTTL overrides TTL for the endpoints it names. Each value
	// follows the same rule as TTL. Default: none.
	EndpointTTL map[string]time.Duration

	// MaxBodyBytes is the largest response body kept, at most 256 MiB. A
	// larger one is dropped: the record keeps its length and SHA-256
	// digest and says BodyOmitted. Default: 4 MiB.
	MaxBodyBytes int64

	// Reconcile is handed each overdue record, under a fresh lease, by
	// Store.Reconcile. It should find out what the earlier attempt did
	// and record it (Complete, MarkFailed, MarkUnknown) or Release the
	// key. An error leaves the record for a later pass. Default: none;
	// overdue records are only counted.
	Reconcile func(ctx context.Context, l idem.Lease) error

	// SweepInterval is how often the store's background loop deletes
	// expired records (Sweep) and, with a Reconcile, hands overdue claims
	// to it (Store.Reconcile). Replicas take turns: a sweep that finds
	// another replica sweeping does nothing, and each overdue claim goes
	// to one replica. Negative disables the loop; Sweep and Reconcile can
	// still be called. Default: 1 minute (idem.DefaultSweepInterval).
	SweepInterval time.Duration

	// Events, when set, gets one Info line per event (idem.LogEvent).
	// Default: none.
	Events *slog.Logger

	// Logger gets the store's warnings: a lost listener connection, a
	// failed reconciler. Default: slog.Default().
	Logger *slog.Logger

	// Migrate says what Open does when the database schema is older than
	// this package. Default: MigrateApply.
	Migrate MigrateMode

	// Schema is the PostgreSQL schema that holds the store's tables; it
	// must exist. Every statement names it, so the search_path never
	// decides which table one reaches. Default: the one schema on the
	// search_path at Open that holds them (Open fails with
	// ErrAmbiguousSchema when several do), or, for a new database,
	// current_schema().
	Schema string

	// RequireSynchronousStandby makes Open fail with ErrNotDurable unless
	// the server acknowledges a commit only once a synchronous standby has
	// it (synchronous_standby_names set, synchronous_commit on,
	// remote_write or remote_apply), so that promoting that standby loses
	// no acknowledged claim. Either way Open logs what an acknowledged
	// claim survives. Default: false.
	RequireSynchronousStandby bool
}

// MigrateMode says whether Open may change the database schema.
type MigrateMode uint8

const (
	// MigrateApply applies the missing migrations, one transaction each,
	// under an advisory lock so that replicas opening at once take turns.
	MigrateApply MigrateMode = iota
	// MigrateRefuse makes Open fail with ErrSchemaBehind, naming the
	// missing versions, instead of changing the schema; for deployments
	// where migrations run as a separate step.
	MigrateRefuse
)

// maxBodyLimit bounds MaxBodyBytes well below PostgreSQL's 1 GiB limit on
// one value.
const maxBodyLimit = 256 << 20

// withDefaults validates o and returns a copy with the defaults filled
// in. Its error lists every bad field and matches
// idem.ErrInvalidOptions.
func (o *Options) withDefaults() (Options, error) {
	var c Options
	if o != nil {
		c = *o
	}
	c.EndpointTTL = maps.Clone(c.EndpointTTL)
	def := func(p *time.Duration, d time.Duration) {
		if *p == 0 {
			*p = d
		}
	}
	def(&c.Lease, idem.DefaultLease)
	def(&c.TTL, idem.DefaultTTL)
	def(&c.SweepInterval, idem.DefaultSweepInterval)
	def(&c.ClaimWait, 2*time.Second)
	def(&c.ClockSkew, time.Second)
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = idem.DefaultMaxBodyBytes
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}

	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: pgstore: "+format, append([]any{idem.ErrInvalidOptions}, args...)...))
	}
	if c.Lease < 0 {
		bad("Lease %s is negative", c.Lease)
	}
	if err := idem.CheckTTLs(c.TTL, c.EndpointTTL, c.Lease); err != nil {
		errs = append(errs, err)
	}
	if c.ClockSkew < 0 {
		bad("ClockSkew %s is negative", c.ClockSkew)
	}
	if c.ClaimWait < 0 {
		bad("ClaimWait %s is negative", c.ClaimWait)
	}
	if c.MaxBodyBytes < 0 || c.MaxBodyBytes > maxBodyLimit {
		bad("MaxBodyBytes %d is outside 0-%d", c.MaxBodyBytes, maxBodyLimit)
	}
	if c.Migrate > MigrateRefuse {
		bad("Migrate %d is not a MigrateMode", c.Migrate)
	}
	return c, errors.Join(errs...)
}

// reconcileEvery is how often the background loop hands overdue claims to
// Reconcile, 0 when it does not, for idem.Decide.
func (o *Options) reconcileEvery() time.Duration {
	if o.Reconcile == nil || o.SweepInterval <= 0 {
		return 0
	}
	return o.SweepInterval
}
