package contract_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/idemkv/idem/contract"
)

// A failed record's outcome is known: only the others may have taken
// effect, and the words must say which.
func TestPendingOutcome(t *testing.T) {
	pending := func(s contract.State) error {
		return fmt.Errorf("claim: %w", &contract.KeyError{Err: contract.ErrOutcomePending, State: s})
	}
	assert.Equal(t, "failed, and the key stays spent", contract.PendingOutcome(pending(contract.StateFailed)))
	assert.Contains(t, contract.PendingOutcome(pending(contract.StateInProgress)), "stopped before its outcome was recorded")
	assert.Equal(t, "may or may not have taken effect", contract.PendingOutcome(pending(contract.StateUnknown)))
	assert.Equal(t, "may or may not have taken effect", contract.PendingOutcome(contract.ErrOutcomePending))
}
