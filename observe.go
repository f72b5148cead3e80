package idem

import "time"

// Observation is what a front end (idemhttp, idemgrpc, idem proxy) did with
// one request that carried, or needed, an idempotency key. Observers such
// as idemprom count them.
type Observation struct {
	// Endpoint is the endpoint the front end scoped the key by.
	Endpoint string
	// Unrouted says that no route named the endpoint: it is the request's
	// method and URL path, which may hold IDs, so an observer must not
	// make it a label of its own.
	Unrouted bool
	// Outcome is OutcomeExecuted, OutcomeReplayed, OutcomePanic,
	// OutcomeHijacked, or the code of the problem the request was refused
	// with (CodeInProgress, CodeKeyReuse, ...).
	Outcome string
	// Status is the HTTP status the client got (for gRPC, the status's
	// code), or 0 when the handler hijacked the connection and answered on
	// it.
	Status int
	// Duration is how long the front end took, the handler included.
	Duration time.Duration
}

// The outcomes of an Observation that are not refusals.
const (
	OutcomeExecuted = "executed" // the handler ran and its response was stored (or the key released)
	OutcomeReplayed = "replayed" // the stored response was sent again
	OutcomePanic    = "panic"    // the handler panicked or ended its goroutine; the record is unknown
	OutcomeHijacked = "hijacked" // the handler took the connection; the record is unknown
)
