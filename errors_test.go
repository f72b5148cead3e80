package idem_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/idemkv/idem"
)

// A failed record's outcome is known: only the others may have taken
// effect, and the words must say which.
func TestPendingOutcome(t *testing.T) {
	pending := func(s idem.State) error {
		return fmt.Errorf("claim: %w", &idem.KeyError{Err: idem.ErrOutcomePending, State: s})
	}
	assert.Equal(t, "failed, and the key stays spent", idem.PendingOutcome(pending(idem.StateFailed)))
	assert.Contains(t, idem.PendingOutcome(pending(idem.StateInProgress)), "stopped before its outcome was recorded")
	assert.Equal(t, "may or may not have taken effect", idem.PendingOutcome(pending(idem.StateUnknown)))
	assert.Equal(t, "may or may not have taken effect", idem.PendingOutcome(idem.ErrOutcomePending))
}
