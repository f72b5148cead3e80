package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/internal/pgtest"
	"github.com/idemkv/idem/pgstore"
)

// pgPassword is put in every DSN these tests pass, so that they can check
// that no output repeats it. The test server trusts every connection, so
// the password itself is never checked.
const pgPassword = "s3cret"

// pgDSN returns the DSN of a new, empty database, with a password.
func pgDSN(t *testing.T) string {
	t.Helper()
	u, err := url.Parse(pgtest.DSN(t))
	require.NoError(t, err)
	u.User = url.UserPassword(u.User.Username(), pgPassword)
	return u.String()
}

// migratedDSN is pgDSN with the schema applied by idem migrate.
func migratedDSN(t *testing.T) string {
	t.Helper()
	dsn := pgDSN(t)
	r := runIdem(t, "", "migrate", "--store", dsn)
	require.Equal(t, 0, r.code, r.stderr)
	return dsn
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

// seededDSN is a migrated database holding seedStore's records.
func seededDSN(t *testing.T) string {
	t.Helper()
	dsn := migratedDSN(t)
	var at time.Time
	db, err := pgstore.Open(context.Background(), dsn, &pgstore.Options{Now: func() time.Time { return at },
		Lease: 10 * time.Minute, TTL: 30 * 24 * time.Hour, Migrate: pgstore.MigrateRefuse})
	require.NoError(t, err)
	seedRecords(t, db, &at)
	return dsn
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

// TestStoreFlagMistakes: --store beside --data, or a DSN that does not
// parse, is a usage mistake for every command that opens a store, found
// before any connection is tried, and the message does not repeat the
// DSN.
func TestStoreFlagMistakes(t *testing.T) {
	dsn := "postgres://app:" + pgPassword + "@127.0.0.1:1/appdb"
	for _, args := range [][]string{
		{"inspect"}, {"stats"}, {"check"}, {"compact"},
		append([]string{"get"}, scopeArgs(seeded.completed)...),
		append([]string{"resolve", "--as", "released"}, scopeArgs(seeded.stuck)...),
		{"proxy", "--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:1"},
	} {
		t.Run(args[0], func(t *testing.T) {
			r := runIdem(t, "", append(args, "--data", t.TempDir(), "--store", dsn)...)
			assert.Equal(t, 2, r.code)
			assert.Contains(t, r.stderr, "--data and --store name two different stores")
			assert.Empty(t, r.stdout)
			assert.NotContains(t, r.stderr, pgPassword)

			r = runIdem(t, "", append(args, "--store", "postgres://app:"+pgPassword+"@host:port:x/appdb")...)
			assert.Equal(t, 2, r.code)
			assert.Contains(t, r.stderr, "--store is not a PostgreSQL connection string")
			assert.NotContains(t, r.stderr, pgPassword)
		})
	}
}

func TestMemoryFlagMistakes(t *testing.T) {
	for _, args := range [][]string{
		{"proxy", "--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:1"},
	} {
		t.Run(args[0], func(t *testing.T) {
			r := runIdem(t, "", append(args, "--data", t.TempDir(), "--memory", "3MiB")...)
			assert.Equal(t, 2, r.code)
			assert.Contains(t, r.stderr, "--memory 3MiB is below the smallest budget, 4MiB")

			r = runIdem(t, "", append(args, "--memory", "16MiB", "--store", "postgres://app@127.0.0.1:1/appdb")...)
			assert.Equal(t, 2, r.code)
			assert.Contains(t, r.stderr, "--memory sizes the embedded store")

			r = runIdem(t, "", append(args, "--data", t.TempDir(), "--memory", "lots")...)
			assert.Equal(t, 2, r.code)
			assert.Contains(t, r.stderr, "want a number of bytes")
		})
	}
}

// --require-sync-standby is a usage mistake with the embedded store, and
// refuses a PostgreSQL server without a synchronous standby.
func TestRequireSyncStandby(t *testing.T) {
	args := []string{"proxy", "--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:1", "--require-sync-standby"}
	r := runIdem(t, "", append(args, "--data", t.TempDir())...)
	assert.Equal(t, 2, r.code)
	assert.Contains(t, r.stderr, "--require-sync-standby is about PostgreSQL's standbys")

	dsn := pgDSN(t)
	r = runIdem(t, "", append(args, "--store", dsn)...)
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "can lose acknowledged claims in a failover")
	assert.Contains(t, r.stderr, "survives a crash of this server, not its loss")
	assertNoSecret(t, dsn, r.stderr)
}

// TestToolsOnPostgres runs the tools against seedStore's records kept in
// PostgreSQL.
func TestToolsOnPostgres(t *testing.T) {
	dsn := seededDSN(t)
	var outputs []string
	tool := func(args ...string) result {
		t.Helper()
		r := runIdem(t, "", append(args, "--store", dsn)...)
		outputs = append(outputs, r.stdout, r.stderr)
		return r
	}

	r := tool(append([]string{"get"}, scopeArgs(seeded.completed)...)...)
	require.Equal(t, 0, r.code, r.stderr)
	for _, want := range []string{"key:          " + seeded.completed.Key + "\n", "state:        completed\n",
		"status:       201\n", "header:       Content-Type: application/json\n", "body:         14 bytes, sha256 "} {
		assert.Contains(t, r.stdout, want)
	}
	assert.Regexp(t, `created:      \S+ \(1h30m ago\)`, r.stdout)
	r = tool(append([]string{"get", "--body"}, scopeArgs(seeded.big)...)...)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, string(bigBody), r.stdout)
	r = tool(append([]string{"get"}, scopeArgs(seeded.expired)...)...)
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "no record for key hash")

	r = tool("inspect", "--json", "--expired")
	require.Equal(t, 0, r.code, r.stderr)
	assert.ElementsMatch(t, hashOf(seeded.completed, seeded.stuck, seeded.unknown, seeded.fresh, seeded.expired, seeded.failed, seeded.big),
		hashes(jsonLines(t, r.stdout)))
	r = tool("inspect", "--json", "--state", "in_progress", "--older-than", "1h")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, hashOf(seeded.stuck), hashes(jsonLines(t, r.stdout)))

	r = tool("stats", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	var st storeStats
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st))
	assert.Equal(t, int64(6), st.Records)
	assert.Equal(t, map[string]int64{"completed": 2, "in_progress": 2, "unknown": 1, "failed": 1}, st.ByState)
	assert.Equal(t, int64(1), st.Overdue)
	assert.Equal(t, int64(1), st.Expired)
	require.NotNil(t, st.TableBytes)
	assert.Positive(t, *st.TableBytes)
	assert.Nil(t, st.DiskBytes, "no directory to measure")
	assert.Nil(t, st.ReadAmp, "no Pebble to ask")
	r = tool("stats")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Regexp(t, `records\s+6 live\n`, r.stdout)
	assert.Regexp(t, `table\s+\S+ \S+ with its indexes\n`, r.stdout)
	assert.NotContains(t, r.stdout, "read amp")

	r = tool(append([]string{"resolve", "--as", "completed", "--status", "201", "--header", "Content-Type: text/plain",
		"--body-file", "-", "--reason", "ticket 7"}, scopeArgs(seeded.stuck)...)...)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "resolved key hash "+idem.KeyHash(seeded.stuck.Key)+" as completed\n", r.stdout)
	assert.Contains(t, r.stderr, "from=in_progress")
	r = tool(append([]string{"resolve", "--as", "released"}, scopeArgs(seeded.fresh)...)...)
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "lease runs for another")

	r = tool("compact")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Regexp(t, `^swept 1 expired records \(.+\) from the PostgreSQL store at 127\.0\.0\.1:\d+\n$`, r.stdout)
	r = tool("inspect", "--json", "--expired")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Len(t, jsonLines(t, r.stdout), 6, "the expired record is gone")

	r = tool("check")
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "no consistency check for this store")
	assert.Empty(t, r.stdout)

	assertNoSecret(t, dsn, outputs...)
}

// TestToolsRefuseAnUnmigratedDatabase: a tool pointed at a database
// without the schema says how to apply it, and creates nothing there.
func TestToolsRefuseAnUnmigratedDatabase(t *testing.T) {
	dsn := pgDSN(t)
	for _, args := range [][]string{
		{"inspect"}, {"stats"}, {"compact"},
		append([]string{"get"}, scopeArgs(seeded.completed)...),
		append([]string{"resolve", "--as", "released"}, scopeArgs(seeded.stuck)...),
	} {
		t.Run(args[0], func(t *testing.T) {
			r := runIdem(t, "", append(args, "--store", dsn)...)
			assert.Equal(t, 1, r.code)
			assert.Empty(t, r.stdout)
			assert.Contains(t, r.stderr, "has no idem schema, or an older one")
			assert.Contains(t, r.stderr, "run idem migrate --store DSN")
			assertNoSecret(t, dsn, r.stderr)
		})
	}
	assert.False(t, tableExists(t, dsn, "idem_schema_migrations"))
	assert.False(t, tableExists(t, dsn, "idempotency_keys"))
}

// TestProxyOnPostgres runs two proxies on one database and the tools
// beside them: a claim made through one proxy is seen by the tools while
// it runs, and replayed by the other proxy once complete.
func TestProxyOnPostgres(t *testing.T) {
	dsn := pgDSN(t) // the proxy applies the schema itself
	u := newUpstream(t)
	u.Start()
	start := func() *daemon {
		return startDaemon(t, "proxy", "--store", dsn, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--upstream", u.URL)
	}
	p1 := start()
	assert.Regexp(t, `^the PostgreSQL store at 127\.0\.0\.1:\d+$`, p1.data)
	p2 := start()

	key := newKey()
	answered := make(chan reply, 1)
	go func() {
		r, err := trySend(context.Background(), "POST", p1.url+"/block", `{"n":1}`, keyed(key)...)
		assert.NoError(t, err)
		answered <- r
	}()
	select {
	case <-u.started:
	case <-time.After(guard):
		t.Fatal("the request never reached the upstream")
	}

	// The request is at the upstream: the proxies hold the records, and
	// the tools read them all the same.
	r := runIdem(t, "", "inspect", "--store", dsn, "--json", "--show-keys")
	require.Equal(t, 0, r.code, r.stderr)
	views := jsonLines(t, r.stdout)
	require.Len(t, views, 1)
	assert.Equal(t, key, views[0].Key)
	assert.Equal(t, "in_progress", views[0].State)
	tenant := sha256.Sum256([]byte(auth))
	assert.Equal(t, hex.EncodeToString(tenant[:]), views[0].Tenant)
	r = runIdem(t, "", "stats", "--store", dsn, "--json")
	require.Equal(t, 0, r.code, r.stderr)
	var st storeStats
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st))
	assert.Equal(t, int64(1), st.ByState["in_progress"])
	outputs := []string{r.stdout, r.stderr}

	dup := send(t, "POST", p2.url+"/block", `{"n":1}`, keyed(key)...)
	assert.Equal(t, http.StatusConflict, dup.status, "the other proxy sees the claim")
	close(u.release)
	first := <-answered
	require.Equal(t, http.StatusCreated, first.status, "%s", first.body)

	replay := send(t, "POST", p2.url+"/block", `{"n":1}`, keyed(key)...)
	assert.Equal(t, http.StatusCreated, replay.status)
	assert.Equal(t, "true", replay.header.Get("Idempotent-Replayed"))
	assert.Equal(t, first.body, replay.body)
	assert.Equal(t, 1, u.count(auth, key), "executed once across both proxies")

	r = runIdem(t, "", "get", "--store", dsn, "--tenant", views[0].Tenant, "--endpoint", views[0].Endpoint, "--key", key)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "state:        completed\n")
	assert.Contains(t, r.stdout, "status:       201\n")
	outputs = append(outputs, r.stdout, r.stderr)

	health := send(t, "GET", p1.adminURL()+"/healthz", "")
	assert.Equal(t, http.StatusOK, health.status)
	mfs := scrape(t, p2.adminURL()+"/metrics")
	assert.Positive(t, scalar(t, mfs, "idem_pg_table_bytes"))
	assert.Equal(t, 1.0, scalar(t, mfs, "idem_pg_listener_connected"))

	for _, p := range []*daemon{p1, p2} {
		require.Equal(t, 0, p.stop(), p.stderr.String())
		p.mu.Lock()
		outputs = append(outputs, strings.Join(p.stdout, "\n"), p.stderr.String())
		p.mu.Unlock()
	}
	assertNoSecret(t, dsn, outputs...)
}

// TestStoreDSNSources: the connection string may come from --store-file
// or IDEM_STORE_DSN, out of the process list; an explicit --data wins over
// the environment, and two sources on the command line are a mistake.
func TestStoreDSNSources(t *testing.T) {
	dsn := pgDSN(t)
	r := runIdem(t, "", "migrate", "--store", dsn)
	require.Equal(t, 0, r.code, r.stderr)
	file := filepath.Join(t.TempDir(), "dsn")
	require.NoError(t, os.WriteFile(file, []byte(dsn+"\n"), 0o600))

	r = runIdem(t, "", "stats", "--store-file", file)
	assert.Equal(t, 0, r.code, r.stderr)
	t.Setenv(storeDSNEnv, dsn)
	r = runIdem(t, "", "stats")
	assert.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "with its indexes", "the environment's PostgreSQL store is the one read")
	r = runIdem(t, "", "stats", "--data", t.TempDir())
	assert.Equal(t, 1, r.code, "an explicit --data is used, and it holds no store: %s", r.stderr)

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--store", dsn, "--store-file", file}, "--store and --store-file both give the connection string"},
		{[]string{"--store-file", filepath.Join(t.TempDir(), "missing")}, "--store-file: open"},
		{[]string{"--store-file", os.DevNull}, "--store-file is empty"},
	} {
		r := runIdem(t, "", append([]string{"stats"}, c.args...)...)
		assert.Equal(t, 2, r.code, c.args)
		assert.Contains(t, r.stderr, c.want, c.args)
		assert.NotContains(t, r.stderr, pgPassword)
	}
}
