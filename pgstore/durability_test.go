package pgstore_test

import (
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem/internal/pgtest"
	"github.com/idemkv/idem/pgstore"
)

// Open says what an acknowledged claim survives on a server without a
// standby, and RequireSynchronousStandby refuses it.
func TestDurabilityOneServer(t *testing.T) {
	dsn := pgtest.DSN(t)
	var log syncBuffer
	open(t, dsn, &pgstore.Options{Logger: slog.New(slog.NewTextHandler(&log, nil))})
	assert.Contains(t, log.String(), "level=INFO")
	assert.Contains(t, log.String(), "survives a crash of this server, not its loss")

	_, err := pgstore.Open(t.Context(), dsn, &pgstore.Options{RequireSynchronousStandby: true, SweepInterval: -1})
	require.ErrorIs(t, err, pgstore.ErrNotDurable)
	assert.Contains(t, err.Error(), `synchronous_standby_names=""`)

	var lossy syncBuffer
	open(t, dsn+"&synchronous_commit=off", &pgstore.Options{Logger: slog.New(slog.NewTextHandler(&lossy, nil))})
	assert.Contains(t, lossy.String(), "level=WARN")
	assert.Contains(t, lossy.String(), "not even a crash of this server")
}
