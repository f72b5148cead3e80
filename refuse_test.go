package idem_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/idemkv/idem"
)

func TestRefuse(t *testing.T) {
	keyErr := func(err error, st idem.State, retry time.Duration) error {
		return fmt.Errorf("claim: %w", &idem.KeyError{Err: err, State: st, RetryAfter: retry})
	}
	reconciling := &idem.KeyError{Err: idem.ErrOutcomePending, State: idem.StateInProgress, RetryAfter: time.Minute, Reconciling: true}
	for _, c := range []struct {
		name   string
		err    error
		code   string
		retry  time.Duration
		detail string
	}{
		{"mismatch", keyErr(idem.ErrFingerprintMismatch, idem.StateCompleted, 0), idem.CodeKeyReuse, 0, "used for a different call"},
		{"in progress", keyErr(idem.ErrInProgress, idem.StateInProgress, 700*time.Millisecond), idem.CodeInProgress, 700 * time.Millisecond, "still being processed"},
		{"reconciling", reconciling, idem.CodeInProgress, time.Minute, "finding out what became of it"},
		{"failed", keyErr(idem.ErrOutcomePending, idem.StateFailed, 0), idem.CodeOutcomePending, 0, "failed, and the key stays spent"},
		{"overdue", keyErr(idem.ErrOutcomePending, idem.StateInProgress, 0), idem.CodeOutcomePending, 0, "stopped before its outcome was recorded"},
		{"unknown", keyErr(idem.ErrOutcomePending, idem.StateUnknown, 0), idem.CodeOutcomePending, 0, "may or may not have taken effect"},
		{"bare pending", idem.ErrOutcomePending, idem.CodeOutcomePending, 0, "Do not send the call under a new key"},
		{"scope", fmt.Errorf("%w: the key is empty", idem.ErrInvalidScope), idem.CodeKeyInvalid, 0, "the key is empty"},
		{"clock", idem.ErrClockBehind, idem.CodeClockBehind, idem.ClockBehindRetry, "clock is behind"},
		{"no tenant", fmt.Errorf("%w", idem.ErrNoTenant), idem.CodeTenantMissing, 0, "carries no credential"},
		{"not stored", fmt.Errorf("%w: disk full", idem.ErrOutcomeNotStored), idem.CodeStoreUnavailable, time.Second, "the call ran but its outcome could not be stored"},
		{"store down", fmt.Errorf("connection refused"), idem.CodeStoreUnavailable, time.Second, "store is unavailable"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := idem.Refuse(c.err, "call")
			assert.Equal(t, c.code, r.Code)
			assert.Equal(t, c.retry, r.RetryAfter)
			assert.Contains(t, r.Detail, c.detail)
			assert.NotContains(t, r.Detail, "connection refused", "a store's error never reaches the client")
		})
	}
}
