package pgstore_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem/idemtest"
	"github.com/idemkv/idem/internal/pgtest"
	"github.com/idemkv/idem/pgstore"
)

// BenchmarkSweep deletes expired records beside as many live ones: with
// Sweep, a thousand per statement on the expires_at index, and, as the
// baseline, with one DELETE of them all. Their records/s side by side say
// what bounding each statement, and accounting for each record, cost.
func BenchmarkSweep(b *testing.B) {
	const perRound = 20000 // expired records per round, and live ones kept
	dsn := pgtest.DSN(b)
	ctx := context.Background()
	clock := idemtest.NewClock()
	s, err := pgstore.Open(ctx, dsn, &pgstore.Options{Now: clock.Now, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(b, err)
	defer s.Close()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(b, err)
	defer conn.Close(ctx)

	// fill inserts n records with 1 KiB bodies, named by prefix, expiring
	// at expires.
	fill := func(prefix string, n int, expires time.Time) {
		_, err := conn.Exec(ctx, `INSERT INTO idempotency_keys (tenant, endpoint, idem_key, fingerprint, state,
			response_status, response_headers, response_body, body_len, body_digest,
			lease_token, lease_until, attempts, created_at, updated_at, expires_at)
			SELECT 't', 'POST /v1/charges', $1 || i, sha256(i::text::bytea), 2,
				201, '{"Content-Type":["application/json"]}', convert_to(repeat('x', 1024), 'UTF8'), 1024, sha256(''::bytea),
				'\x01'::bytea, $2, 1, $2, $2, $3
			FROM generate_series(1, $4) AS i`, prefix, clock.Now(), expires, n)
		require.NoError(b, err)
		_, err = conn.Exec(ctx, "ANALYZE idempotency_keys")
		require.NoError(b, err)
	}
	fill("live-", perRound, clock.Now().Add(time.Hour))

	for _, c := range []struct {
		name  string
		sweep func() (int, error)
	}{
		{"sweep", func() (int, error) {
			res, err := s.Sweep(ctx)
			return res.Records, err
		}},
		{"one-delete", func() (int, error) {
			tag, err := conn.Exec(ctx, "DELETE FROM idempotency_keys WHERE expires_at <= $1", clock.Now())
			return int(tag.RowsAffected()), err
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			var (
				swept   int
				elapsed time.Duration
			)
			for i := range b.N {
				b.StopTimer()
				fill(c.name+"-"+time.Duration(i).String()+"-", perRound, clock.Now().Add(-time.Second))
				b.StartTimer()
				start := time.Now()
				n, err := c.sweep()
				elapsed += time.Since(start)
				require.NoError(b, err)
				require.Equal(b, perRound, n, "every expired record, and no live one")
				swept += n
			}
			b.ReportMetric(float64(swept)/elapsed.Seconds(), "records/s")
		})
	}
}
