package idem

import (
	"context"
	"errors"

	"github.com/idemkv/idem/contract"
)

// The contract's vocabulary, defined and documented in package contract
// and named here too, so that a program using the embedded store needs
// one import.
type (
	Scope           = contract.Scope           // see contract.Scope
	Fingerprint     = contract.Fingerprint     // see contract.Fingerprint
	KeyError        = contract.KeyError        // see contract.KeyError
	Store           = contract.Store           // see contract.Store
	Lease           = contract.Lease           // see contract.Lease
	Operator        = contract.Operator        // see contract.Operator
	Filter          = contract.Filter          // see contract.Filter
	Metrics         = contract.Metrics         // see contract.Metrics
	Figure          = contract.Figure          // see contract.Figure
	Event           = contract.Event           // see contract.Event
	ReconcileResult = contract.ReconcileResult // see contract.ReconcileResult
	SweepResult     = contract.SweepResult     // see contract.SweepResult
	CompactProgress = contract.CompactProgress // see contract.CompactProgress
)

// The events a store counts and logs; see contract.Event.
const (
	EventClaimed     = contract.EventClaimed
	EventReplayed    = contract.EventReplayed
	EventConflict    = contract.EventConflict
	EventMismatch    = contract.EventMismatch
	EventPending     = contract.EventPending
	EventCompleted   = contract.EventCompleted
	EventReleased    = contract.EventReleased
	EventUnknown     = contract.EventUnknown
	EventFailed      = contract.EventFailed
	EventTakenOver   = contract.EventTakenOver
	EventReconciled  = contract.EventReconciled
	EventSwept       = contract.EventSwept
	EventClockBehind = contract.EventClockBehind
)

// Limits on a Scope; see contract.MaxKeyBytes.
const (
	MaxTenantBytes   = contract.MaxTenantBytes
	MaxEndpointBytes = contract.MaxEndpointBytes
	MaxKeyBytes      = contract.MaxKeyBytes
)

// The contract's errors, documented in package contract.
var (
	ErrInProgress          = contract.ErrInProgress
	ErrFingerprintMismatch = contract.ErrFingerprintMismatch
	ErrOutcomePending      = contract.ErrOutcomePending
	ErrLeaseLost           = contract.ErrLeaseLost
	ErrNotFound            = contract.ErrNotFound
	ErrCompleted           = contract.ErrCompleted
	ErrClosed              = contract.ErrClosed
	ErrInvalidScope        = contract.ErrInvalidScope
	ErrInvalidResponse     = contract.ErrInvalidResponse
	ErrInvalidOptions      = contract.ErrInvalidOptions
	ErrCorrupt             = contract.ErrCorrupt
	ErrClockBehind         = contract.ErrClockBehind
)

// Errors of the embedded store alone.
var (
	// ErrLocked: another DB handle, in this process or another, holds the
	// directory.
	ErrLocked = errors.New("idem: data directory is in use")
	// ErrNoStore: Open with Options.MustExist found no store in the
	// directory.
	ErrNoStore = errors.New("idem: no store in directory")
)

// KeyHash is contract.KeyHash: a short digest of a key for logs.
func KeyHash(key string) string { return contract.KeyHash(key) }

// DownstreamKey is contract.DownstreamKey: the key to forward to a
// downstream service for one step of the operation s names.
func DownstreamKey(s Scope, step string) string { return contract.DownstreamKey(s, step) }

// DB is the embedded backend of the contract.
var _ Operator = (*DB)(nil)

// ErrNoEffect is contract.ErrNoEffect: what an operation run by Do returns
// when it provably took no effect.
var ErrNoEffect = contract.ErrNoEffect

// Do is contract.Do: it runs fn at most once under a claim on store and
// records its outcome, the managed form of Claim and Lease.
func Do(ctx context.Context, store Store, s Scope, fp Fingerprint,
	fn func(ctx context.Context, l Lease) (Response, error)) (resp Response, replayed bool, err error) {
	return contract.Do(ctx, store, s, fp, fn)
}
