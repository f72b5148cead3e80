package idem

import "github.com/idemkv/idem/contract"

// A record is one row of the reference's idempotency_keys table. Its
// types are the contract's, named here too; the embedded store's encoding
// of one in a Pebble value lives in internal/record, and its keys in
// internal/keys.
type (
	Record   = contract.Record   // see contract.Record
	State    = contract.State    // see contract.State
	Response = contract.Response // see contract.Response
)

// The states of a record; see contract.State.
const (
	StateInProgress = contract.StateInProgress
	StateCompleted  = contract.StateCompleted
	StateFailed     = contract.StateFailed
	StateUnknown    = contract.StateUnknown
)

// ParseState is contract.ParseState.
func ParseState(name string) (State, error) { return contract.ParseState(name) }
