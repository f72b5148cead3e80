package pgstore

import (
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestUnverifiedRemote: a server across a network is reached safely only
// with verify-full; a socket or loopback needs nothing.
func TestUnverifiedRemote(t *testing.T) {
	for dsn, want := range map[string]bool{
		"postgres://u@db.example.com/idem":                              true, // prefer: may fall back to plaintext
		"postgres://u@db.example.com/idem?sslmode=disable":              true,
		"postgres://u@db.example.com/idem?sslmode=require":              true,
		"postgres://u@db.example.com/idem?sslmode=verify-ca":            true,
		"postgres://u@db.example.com/idem?sslmode=verify-full":          false,
		"postgres://u@10.0.0.5,db.example.com/idem?sslmode=verify-full": false,
		"host=db.example.com,127.0.0.1 sslmode=require":                 true,
		"postgres://u@127.0.0.1/idem?sslmode=disable":                   false,
		"postgres://u@[::1]:5432/idem":                                  false,
		"postgres://u@localhost/idem?sslmode=disable":                   false,
		"host=/var/run/postgresql dbname=idem":                          false,
		"postgres://u@127.0.0.1,db.example.com/idem?sslmode=disable":    true,
	} {
		cfg, err := pgconn.ParseConfig(dsn)
		require.NoError(t, err, dsn)
		assert.Equal(t, want, unverifiedRemote(*cfg), dsn)
	}
}
