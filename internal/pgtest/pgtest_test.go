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

// TestStopStart: a stopped server refuses connections, and comes back
// with its data on the same DSN.
func TestStopStart(t *testing.T) {
	ctx := context.Background()
	dsn := DSN(t)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "CREATE TABLE kept (v int); INSERT INTO kept VALUES (1)")
	require.NoError(t, err)

	Stop(t)
	assert.Error(t, conn.Ping(ctx), "a connection survived the stop")
	conn.Close(ctx)
	_, err = pgx.Connect(ctx, dsn)
	require.Error(t, err, "a stopped server accepted a connection")

	Start(t)
	conn, err = pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var v int
	require.NoError(t, conn.QueryRow(ctx, "SELECT v FROM kept").Scan(&v))
	assert.Equal(t, 1, v)
}

// TestRestart: an immediate restart cuts every connection, and the rows
// committed before it are there after it, on the same DSN.
func TestRestart(t *testing.T) {
	dsn := DSN(t)
	if !Restartable() {
		cannotRun(t, "%s names an external server, which pgtest does not restart", EnvDSN)
	}
	ctx := context.Background()
	before, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer before.Close(ctx)
	_, err = before.Exec(ctx, "CREATE TABLE x (v int); INSERT INTO x VALUES (42)")
	require.NoError(t, err)

	Restart(t)
	_, err = before.Exec(ctx, "SELECT 1")
	assert.Error(t, err, "a connection from before the restart still works")
	after, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer after.Close(ctx)
	var v int
	require.NoError(t, after.QueryRow(ctx, "SELECT v FROM x").Scan(&v))
	assert.Equal(t, 42, v)
}
