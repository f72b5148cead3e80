package main

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem/internal/pgtest"
)

// pgPassword is put in every DSN these tests pass, so that they can check
// that no output repeats it. The test server trusts every connection, so
// the password itself is never checked.
const pgPassword = "s3cret"

// pgDSN returns the DSN of a new, empty database, with a password.
func pgDSN(t *testing.T) string {
	t.Helper()
	dsn := pgtest.DSN(t)
	withPassword := strings.Replace(dsn, "://postgres@", "://postgres:"+pgPassword+"@", 1)
	require.NotEqual(t, dsn, withPassword, "pgtest's DSN changed shape")
	return withPassword
}

// assertNoSecret checks that outputs hold neither the password nor the
// database's name, which only the DSN knows.
func assertNoSecret(t *testing.T, dsn string, outputs ...string) {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	require.NoError(t, err)
	for _, out := range outputs {
		assert.NotContains(t, out, pgPassword)
		assert.NotContains(t, out, cfg.Database)
	}
}

// tableExists reports whether the database dsn names has table name.
func tableExists(t *testing.T, dsn, name string) bool {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var exists bool
	require.NoError(t, conn.QueryRow(context.Background(), "SELECT to_regclass($1) IS NOT NULL", name).Scan(&exists))
	return exists
}
