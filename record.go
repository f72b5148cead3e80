package idem

import (
	"fmt"
	"net/http"
	"time"
)

// State is where a record stands in the claim lifecycle. The zero value means
// that no record exists.
type State uint8

// The states of a record. Only StateCompleted is ever replayed.
const (
	// StateInProgress: a caller holds the lease and the operation may be
	// running now.
	StateInProgress State = iota + 1
	// StateCompleted: the response is stored and every repeat replays it.
	StateCompleted
	// StateFailed: the operation is known not to have taken effect, but the
	// key stays spent until an operator or the TTL frees it.
	StateFailed
	// StateUnknown: the operation may have taken effect; a person or a
	// reconciler must find out before anything else happens to the key.
	StateUnknown
)

var stateNames = [...]string{"none", "in_progress", "completed", "failed", "unknown"}

// String returns the state's name as the reference schema spells it
// (in_progress, completed, failed, unknown), or "none" for the zero value.
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// ParseState is the inverse of State.String for the four real states.
func ParseState(name string) (State, error) {
	for i, n := range stateNames[1:] {
		if n == name {
			return State(i + 1), nil
		}
	}
	return 0, fmt.Errorf("idem: unknown state %q", name)
}

// Response is what a completed operation answered, kept for replay.
type Response struct {
	// Status is the HTTP status code, 100 to 999.
	Status int
	// Header holds the response headers to replay. A nil map stores none.
	// At most MaxResponseHeaders values and MaxResponseHeaderBytes in all.
	Header http.Header
	// Body is the response body. Bodies longer than the store's body cap
	// are not stored; see Record.BodyOmitted.
	Body []byte
}

// The bounds on a stored response's header, the same in every store: a
// header is kept with every record and sent with every replay, so an
// upstream that answers with thousands of fields must not make each of
// its records megabytes.
const (
	MaxResponseHeaders = 256
	// MaxResponseHeaderBytes counts each value as HTTP/1.1 sends it: name,
	// ": ", value and CRLF.
	MaxResponseHeaderBytes = 64 << 10
)

// Check reports, as an error matching ErrInvalidResponse, why a store's
// Complete would refuse r: a status outside 100-999, or a header beyond
// MaxResponseHeaders or MaxResponseHeaderBytes. Every store checks it
// before it writes anything.
func (r Response) Check() error {
	if r.Status < 100 || r.Status > 999 {
		return fmt.Errorf("%w: status %d is outside 100-999", ErrInvalidResponse, r.Status)
	}
	n, size := 0, 0
	for name, vs := range r.Header {
		n += len(vs)
		for _, v := range vs {
			size += len(name) + len(v) + 4
		}
	}
	switch {
	case n > MaxResponseHeaders:
		return fmt.Errorf("%w: %d header values, more than %d", ErrInvalidResponse, n, MaxResponseHeaders)
	case size > MaxResponseHeaderBytes:
		return fmt.Errorf("%w: %d header bytes, more than %d", ErrInvalidResponse, size, MaxResponseHeaderBytes)
	}
	return nil
}

// Record is one stored idempotency record. Records a store returns are
// copies that the caller owns.
type Record struct {
	Scope       Scope
	Fingerprint Fingerprint
	State       State
	// Response is set for completed records.
	Response Response
	// BodyOmitted reports whether the response body was too large to keep;
	// BodyLen and BodyDigest still describe it.
	BodyOmitted bool
	// BodyLen and BodyDigest (SHA-256) describe the response body as it was
	// produced, whether or not it was kept.
	BodyLen    int64
	BodyDigest [32]byte
	CreatedAt  time.Time
	UpdatedAt  time.Time
	ExpiresAt  time.Time
	// LeaseUntil is when the current holder's lease runs out (in progress),
	// or when the record left that state.
	LeaseUntil time.Time
	// Attempts counts the leases granted on this record: 1 for the first
	// claim, plus one for each takeover by a reconciler or an operator.
	Attempts uint32
}
