package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMigrate(t *testing.T) {
	dsn := pgDSN(t)
	var outputs []string
	migrate := func(args ...string) result {
		t.Helper()
		r := runIdem(t, "", append([]string{"migrate", "--store", dsn}, args...)...)
		outputs = append(outputs, r.stdout, r.stderr)
		return r
	}

	r := migrate("--check")
	assert.Equal(t, 1, r.code, r.stderr)
	assert.Regexp(t, `^the PostgreSQL store at 127\.0\.0\.1:\d+ needs migrations \(.*lacks version 1, 2\): run idem migrate --store DSN to apply them\n$`, r.stdout)
	assert.False(t, tableExists(t, dsn, "idem_schema_migrations"), "--check changes nothing")

	r = migrate()
	require.Equal(t, 0, r.code, r.stderr)
	assert.Regexp(t, `^applied migration 1 \(idempotency_keys\)\napplied migration 2 \(idempotency_keys_waiting\)\nThe PostgreSQL store at 127\.0\.0\.1:\d+ is at schema version 2, up to date\n$`, r.stdout)
	assert.Empty(t, r.stderr)
	assert.True(t, tableExists(t, dsn, "idempotency_keys"))

	r = migrate()
	require.Equal(t, 0, r.code, r.stderr)
	assert.Regexp(t, `^The PostgreSQL store at \S+ is at schema version 2, up to date\n$`, r.stdout, "nothing left to apply")

	r = migrate("--check")
	assert.Equal(t, 0, r.code, r.stderr)
	assert.Regexp(t, `^The PostgreSQL store at \S+ is at schema version 2, up to date\n$`, r.stdout)

	assertNoSecret(t, dsn, outputs...)
}

func TestMigrateFailures(t *testing.T) {
	down := "postgres://app:" + pgPassword + "@127.0.0.1:1/appdb?connect_timeout=5"
	cases := []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"no store", nil, 2, "--store is required"},
		{"argument", []string{"--store", down, "now"}, 2, `unexpected argument "now"`},
		{"bad DSN", []string{"--store", "postgres://app:" + pgPassword + "@h:p:x/appdb"}, 2, "not a PostgreSQL connection string"},
		{"unreachable", []string{"--store", down}, 1, "idem migrate: the PostgreSQL store at 127.0.0.1:1: pgstore: connect: cannot connect"},
		{"unreachable check", []string{"--store", down, "--check"}, 1, "cannot connect"},
		{"help", []string{"--help"}, 0, "usage: idem migrate"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := runIdem(t, "", append([]string{"migrate"}, c.args...)...)
			assert.Equal(t, c.code, r.code)
			assert.Empty(t, r.stdout)
			assert.Contains(t, r.stderr, c.stderr)
			assert.NotContains(t, r.stderr, pgPassword)
			assert.NotContains(t, r.stderr, "appdb")
		})
	}
}
