package idemclient

import (
	"errors"
	"fmt"
)

// Errors that callers match with errors.Is.
var (
	// ErrBodyNotRewindable (inside a *RetryError): the request has a body
	// but no GetBody, so a retry could not send it again. The request is
	// refused before its first attempt rather than left unprotected.
	// http.NewRequest sets GetBody for *bytes.Buffer, *bytes.Reader and
	// *strings.Reader bodies.
	ErrBodyNotRewindable = errors.New("idemclient: request body cannot be replayed (Request.GetBody is nil)")
)

// RetryError is the error of a call that ended without a final response:
// the attempts or the time budget ran out, the context ended, the policy or
// the credential refresh failed, or the request could not be sent at all.
// It unwraps to the last cause: the last attempt's transport error, the
// context's error, or an error naming the last retryable status.
type RetryError struct {
	// Key is the idempotency key sent on every attempt; empty if the request
	// did not carry one. Send it again to learn the operation's outcome.
	// It is kept out of Error, as error strings end up in logs.
	Key string
	// Operation is the operation name from WithOperation, if any.
	Operation string
	// Attempts is how many attempts were sent, 0 if none was.
	Attempts int
	// LastStatus is the status of the last response, 0 if the last attempt
	// got none.
	LastStatus int
	// Err is the last cause.
	Err error
	// why says, for Error, why the transport stopped.
	why string
}

func (e *RetryError) Error() string {
	msg := "idemclient: " + e.why
	switch e.Attempts {
	case 0:
	case 1:
		msg += " after 1 attempt"
	default:
		msg += fmt.Sprintf(" after %d attempts", e.Attempts)
	}
	if e.LastStatus != 0 {
		msg += fmt.Sprintf(", last status %d", e.LastStatus)
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

func (e *RetryError) Unwrap() error { return e.Err }
