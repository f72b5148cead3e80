package pgtest

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

// TestDatabasesAreFreshAndApart: each test gets an empty database of its
// own, on a server that syncs its writes.
func TestDatabasesAreFreshAndApart(t *testing.T) {
	ctx := context.Background()
	a, b := DSN(t), DSN(t)
	require.NotEqual(t, a, b)
	ca, err := pgx.Connect(ctx, a)
	require.NoError(t, err)
	defer ca.Close(ctx)
	_, err = ca.Exec(ctx, "CREATE TABLE x (v int)")
	require.NoError(t, err)
	cb, err := pgx.Connect(ctx, b)
	require.NoError(t, err)
	defer cb.Close(ctx)
	var n int
	require.NoError(t, cb.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename = 'x'").Scan(&n))
	assert.Zero(t, n, "a table of one test's database shows in another's")
	var fsync string
	require.NoError(t, cb.QueryRow(ctx, "SHOW fsync").Scan(&fsync))
	assert.Equal(t, "on", fsync)
}
