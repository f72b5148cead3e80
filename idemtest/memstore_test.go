package idemtest_test

import (
	"testing"
	"time"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemtest"
	"github.com/stretchr/testify/require"
)

func TestMemStore(t *testing.T) {
	idemtest.TestStore(t, idemtest.Limits{}, func(t *testing.T, now func() time.Time) idem.Store {
		m, err := idemtest.NewMemStore(&idemtest.MemOptions{Now: now})
		require.NoError(t, err)
		t.Cleanup(func() { _ = m.Close() })
		return m
	})
}
