package main

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// TestPostgresSystems runs each PostgreSQL row of the harness once on a
// real server: its statements must do what the row claims, or its
// figures mean nothing.
func TestPostgresSystems(t *testing.T) {
	for _, name := range []string{"postgres", "postgres-days", "pgstore"} {
		t.Run(name, func(t *testing.T) {
			s, err := openers[name](env{maxConc: 4, bodies: benchBodies, pgDSN: pgtest.DSN(t)})
			require.NoError(t, err)
			defer func() { assert.NoError(t, s.close()) }()

			o := newOp(7)
			body := benchBodies.of(o.key)
			require.NoError(t, s.claimComplete(t.Context(), o, body))
			got, err := s.replay(t.Context(), o)
			require.NoError(t, err)
			assert.Equal(t, body, got)

			assert.Error(t, s.claimComplete(t.Context(), o, body), "a second claim of the key must not succeed")
			_, err = s.replay(t.Context(), newOp(7))
			assert.Error(t, err, "a key never claimed has nothing to replay")
		})
	}
}
