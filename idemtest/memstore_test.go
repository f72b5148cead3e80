package idemtest_test

import (
	"testing"
	"time"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemtest"
)

func TestMemStore(t *testing.T) {
	idemtest.TestStore(t, func(t *testing.T, now func() time.Time) idem.Store {
		m := idemtest.NewMemStore(&idemtest.MemOptions{Now: now})
		t.Cleanup(func() { _ = m.Close() })
		return m
	})
}
