package pgstore_test

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/internal/pgtest"
	"github.com/idemkv/idem/pgstore"
)

// syncBuffer is a bytes.Buffer that a logger may write from many
// goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func TestMigrateOnce(t *testing.T) {
	dsn := pgtest.DSN(t)
	var first, second syncBuffer
	open(t, dsn, &pgstore.Options{Logger: slog.New(slog.NewTextHandler(&first, nil))})
	assert.Contains(t, first.String(), "applied schema migrations")
	open(t, dsn, &pgstore.Options{Logger: slog.New(slog.NewTextHandler(&second, nil))})
	assert.NotContains(t, second.String(), "applied schema migrations", "a second Open applies nothing")
	open(t, dsn, &pgstore.Options{Migrate: pgstore.MigrateRefuse})
}

func TestMigrateRefuse(t *testing.T) {
	dsn := pgtest.DSN(t)
	_, err := pgstore.Open(t.Context(), dsn, &pgstore.Options{Migrate: pgstore.MigrateRefuse})
	require.ErrorIs(t, err, pgstore.ErrSchemaBehind)
	assert.Contains(t, err.Error(), "version 1")
	assert.Contains(t, err.Error(), "MigrateApply")

	conn, err := pgx.Connect(t.Context(), dsn)
	require.NoError(t, err)
	defer conn.Close(t.Context())
	var tables int
	require.NoError(t, conn.QueryRow(t.Context(),
		"SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()").Scan(&tables))
	assert.Zero(t, tables, "a refusing Open creates nothing")
}

func TestMigrateConcurrentOpens(t *testing.T) {
	dsn := pgtest.DSN(t)
	const opens = 4
	var wg sync.WaitGroup
	errs := make([]error, opens)
	for i := range opens {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := pgstore.Open(t.Context(), dsn, nil)
			errs[i] = err
			if err == nil {
				s.Close()
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		assert.NoError(t, err)
	}
}

func TestOpenErrorsHideTheDSN(t *testing.T) {
	const secret = "hunter2-secret"
	for _, dsn := range []string{
		"postgres://someone:" + secret + "@127.0.0.1:1/somedb?connect_timeout=2",
		"postgres://someone:" + secret + "@127.0.0.1:notaport/somedb",
	} {
		_, err := pgstore.Open(t.Context(), dsn, nil)
		require.Error(t, err)
		assert.NotContains(t, err.Error(), secret)
		assert.NotContains(t, err.Error(), "someone")
		assert.NotContains(t, err.Error(), "somedb")
		assert.True(t, strings.HasPrefix(err.Error(), "pgstore: "), err.Error())
	}
}

func TestOptionsReportEveryBadField(t *testing.T) {
	_, err := pgstore.Open(t.Context(), "postgres://unused", &pgstore.Options{
		Lease: -time.Second, TTL: -time.Second, MaxBodyBytes: -1, ClockSkew: -1, ClaimWait: -1,
		EndpointTTL: map[string]time.Duration{"POST /x": -1},
	})
	require.ErrorIs(t, err, idem.ErrInvalidOptions)
	for _, field := range []string{"Lease", "TTL", "MaxBodyBytes", "EndpointTTL", "ClockSkew", "ClaimWait"} {
		assert.Contains(t, err.Error(), field)
	}
}

// A TTL must outlast ten leases, as for the embedded store, whether it is
// the store's or an endpoint's.
func TestOptionsTTLSpansTenLeases(t *testing.T) {
	for _, o := range []*pgstore.Options{
		{TTL: 4 * time.Minute},
		{Lease: time.Minute, TTL: time.Hour, EndpointTTL: map[string]time.Duration{"POST /x": 9 * time.Minute}},
	} {
		_, err := pgstore.Open(t.Context(), "postgres://unused", o)
		require.ErrorIs(t, err, idem.ErrInvalidOptions)
		assert.Contains(t, err.Error(), "at least 10 leases")
	}
}
