// Package contract is the former home of idem's contract, which is now
// the root package, github.com/idemkv/idem. Every name here is an alias of
// the root's, so values, errors and interfaces are interchangeable between
// the two imports while callers move.
//
// Deprecated: import github.com/idemkv/idem instead; this package goes in
// the next release.
package contract

import (
	"context"
	"log/slog"
	"time"

	"github.com/idemkv/idem"
)

// Each type is the root package's; see its documentation there.
type (
	BodyError        = idem.BodyError
	CanonicalOptions = idem.CanonicalOptions
	CompactProgress  = idem.CompactProgress
	Event            = idem.Event
	Figure           = idem.Figure
	Filter           = idem.Filter
	Fingerprint      = idem.Fingerprint
	KeyError         = idem.KeyError
	Lease            = idem.Lease
	Metrics          = idem.Metrics
	Operator         = idem.Operator
	Profile          = idem.Profile
	ReconcileResult  = idem.ReconcileResult
	Record           = idem.Record
	Request          = idem.Request
	Response         = idem.Response
	Scope            = idem.Scope
	State            = idem.State
	Store            = idem.Store
	SweepResult      = idem.SweepResult
	Tally            = idem.Tally
)

// Each constant is the root package's.
const (
	ClockBehindRetry          = idem.ClockBehindRetry
	CodeBodyInvalid           = idem.CodeBodyInvalid
	CodeClockBehind           = idem.CodeClockBehind
	CodeEncodingNotAcceptable = idem.CodeEncodingNotAcceptable
	CodeInProgress            = idem.CodeInProgress
	CodeKeyInvalid            = idem.CodeKeyInvalid
	CodeKeyMissing            = idem.CodeKeyMissing
	CodeKeyReuse              = idem.CodeKeyReuse
	CodeOutcomePending        = idem.CodeOutcomePending
	CodePayloadTooLarge       = idem.CodePayloadTooLarge
	CodeRequestTimeout        = idem.CodeRequestTimeout
	CodeResponseBodyOmitted   = idem.CodeResponseBodyOmitted
	CodeStoreUnavailable      = idem.CodeStoreUnavailable
	CodeTenantMissing         = idem.CodeTenantMissing
	CodeURITooLong            = idem.CodeURITooLong
	EventClaimed              = idem.EventClaimed
	EventClockBehind          = idem.EventClockBehind
	EventCompleted            = idem.EventCompleted
	EventConflict             = idem.EventConflict
	EventFailed               = idem.EventFailed
	EventMismatch             = idem.EventMismatch
	EventPending              = idem.EventPending
	EventReconciled           = idem.EventReconciled
	EventReleased             = idem.EventReleased
	EventReplayed             = idem.EventReplayed
	EventSwept                = idem.EventSwept
	EventTakenOver            = idem.EventTakenOver
	EventUnknown              = idem.EventUnknown
	HeaderBodyOmitted         = idem.HeaderBodyOmitted
	HeaderExpires             = idem.HeaderExpires
	HeaderKey                 = idem.HeaderKey
	HeaderOutcome             = idem.HeaderOutcome
	HeaderReplayed            = idem.HeaderReplayed
	MaxEndpointBytes          = idem.MaxEndpointBytes
	MaxKeyBytes               = idem.MaxKeyBytes
	MaxTenantBytes            = idem.MaxTenantBytes
	MinTTLLeases              = idem.MinTTLLeases
	NumEvents                 = idem.NumEvents
	ProfileExact              = idem.ProfileExact
	ProfileJCS                = idem.ProfileJCS
	StateCompleted            = idem.StateCompleted
	StateFailed               = idem.StateFailed
	StateInProgress           = idem.StateInProgress
	StateUnknown              = idem.StateUnknown
)

// Each error is the root package's very value, so errors.Is matches either.
var (
	ErrClockBehind         = idem.ErrClockBehind
	ErrClosed              = idem.ErrClosed
	ErrCompleted           = idem.ErrCompleted
	ErrCorrupt             = idem.ErrCorrupt
	ErrFingerprintMismatch = idem.ErrFingerprintMismatch
	ErrInProgress          = idem.ErrInProgress
	ErrInvalidBody         = idem.ErrInvalidBody
	ErrInvalidOptions      = idem.ErrInvalidOptions
	ErrInvalidResponse     = idem.ErrInvalidResponse
	ErrInvalidScope        = idem.ErrInvalidScope
	ErrLeaseLost           = idem.ErrLeaseLost
	ErrNoEffect            = idem.ErrNoEffect
	ErrNotFound            = idem.ErrNotFound
	ErrOutcomePending      = idem.ErrOutcomePending
)

// Canonicalize is idem.Canonicalize.
func Canonicalize(src []byte, o CanonicalOptions) ([]byte, error) { return idem.Canonicalize(src, o) }

// CheckTTLs is idem.CheckTTLs.
func CheckTTLs(ttl time.Duration, endpointTTL map[string]time.Duration, lease time.Duration) error {
	return idem.CheckTTLs(ttl, endpointTTL, lease)
}

// Do is idem.Do with its former results: the response, and whether it
// was a replay.
func Do(ctx context.Context, store Store, s Scope, fp Fingerprint,
	fn func(ctx context.Context, l Lease) (Response, error)) (Response, bool, error) {
	res, err := idem.Do(ctx, store, s, fp, nil, fn)
	return res.Response, res.Replayed != nil, err
}

// DownstreamKey is idem.DownstreamKey.
func DownstreamKey(s Scope, step string) string { return idem.DownstreamKey(s, step) }

// KeyHash is idem.KeyHash.
func KeyHash(key string) string { return idem.KeyHash(key) }

// LogEvent is idem.LogEvent.
func LogEvent(l *slog.Logger, e Event, s Scope, rec *Record, latency time.Duration) {
	idem.LogEvent(l, e, s, rec, latency)
}

// ParseProfile is idem.ParseProfile.
func ParseProfile(s string) (Profile, error) { return idem.ParseProfile(s) }

// ParseState is idem.ParseState.
func ParseState(name string) (State, error) { return idem.ParseState(name) }
