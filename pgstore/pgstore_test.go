package pgstore_test

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem/contract"
	"github.com/idemkv/idem/idemtest"
	"github.com/idemkv/idem/internal/pgtest"
	"github.com/idemkv/idem/pgstore"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// open opens a store on dsn and closes it when t ends.
func open(t *testing.T, dsn string, opts *pgstore.Options) *pgstore.Store {
	t.Helper()
	s, err := pgstore.Open(t.Context(), dsn, opts)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	idemtest.TestStore(t, func(t *testing.T, now func() time.Time) contract.Store {
		return open(t, pgtest.DSN(t), &pgstore.Options{Now: now})
	})
}
