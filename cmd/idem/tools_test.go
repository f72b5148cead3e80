package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/pebblestore"
)

// seeded names the records seedStore writes; each key is distinct so a
// test can look for it, raw, in what the tools print.
var seeded = struct {
	completed, stuck, unknown, fresh, expired, failed, big idem.Scope
}{
	completed: idem.Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: "key-completed-4f8c2a1e"},
	stuck:     idem.Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: "key-stuck-6b0d4c7e"},
	unknown:   idem.Scope{Tenant: "acme", Endpoint: "POST /v1/refunds", Key: "key-unknown-9a512f3d"},
	fresh:     idem.Scope{Tenant: "globex", Endpoint: "POST /v1/payments", Key: "key-fresh-8c7b1e90"},
	expired:   idem.Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: "key-expired-11aa22bb"},
	failed:    idem.Scope{Tenant: "globex", Endpoint: "POST /v1/refunds", Key: "key-failed-33cc44dd"},
	big:       idem.Scope{Tenant: "globex", Endpoint: "POST /v1/payments", Key: "key-big-55ee66ff"},
}

// bigBody is larger than a record holds inline, so it is stored in chunks.
var bigBody = []byte(strings.Repeat("0123456789abcdef", 100<<10/16))

// seedStore writes one record of each kind into a new store in dir, with
// creation times in the real past so that the tools, which read the real
// clock, see them aged: stuck was claimed two hours ago and its lease ran
// out, expired ran out of its thirty-day TTL two days ago, fresh holds a lease for
// ten more minutes. The seeding clock jumps back and forth over weeks,
// which the store's clock check would refuse.
func seedStore(t *testing.T, dir string) {
	t.Helper()
	var at time.Time
	db, err := pebblestore.Open(dir, &pebblestore.Options{Now: func() time.Time { return at }, SweepInterval: -1,
		Lease: 10 * time.Minute, TTL: 30 * 24 * time.Hour, ClockTolerance: 365 * 24 * time.Hour})
	require.NoError(t, err)
	seedRecords(t, db, &at)
}

// seedRecords is seedStore on any store whose clock reads *at; it closes
// db.
func seedRecords(t *testing.T, db idem.Store, at *time.Time) {
	t.Helper()
	now := time.Now()
	ctx := context.Background()
	claim := func(s idem.Scope, when time.Time) idem.Lease {
		*at = when
		l, rec, err := db.Claim(ctx, s, idem.Fingerprint{1, 2, 3})
		require.NoError(t, err)
		require.Nil(t, rec)
		return l
	}
	header := http.Header{"Content-Type": {"application/json"}}
	require.NoError(t, claim(seeded.completed, now.Add(-90*time.Minute)).Complete(ctx, idem.Response{Status: 201, Header: header, Body: []byte(`{"id":"pay_1"}`)}))
	claim(seeded.stuck, now.Add(-2*time.Hour))
	require.NoError(t, claim(seeded.unknown, now.Add(-30*time.Minute)).MarkUnknown(ctx))
	claim(seeded.fresh, now)
	require.NoError(t, claim(seeded.expired, now.Add(-32*24*time.Hour)).Complete(ctx, idem.Response{Status: 200}))
	require.NoError(t, claim(seeded.failed, now.Add(-5*time.Minute)).MarkFailed(ctx))
	require.NoError(t, claim(seeded.big, now.Add(-time.Minute)).Complete(ctx, idem.Response{Status: 200, Body: bigBody}))
	require.NoError(t, db.Close())
}

func seededDir(t *testing.T) string {
	dir := filepath.Join(t.TempDir(), "data")
	seedStore(t, dir)
	return dir
}

// jsonLines decodes one JSON object a line.
func jsonLines(t *testing.T, out string) []recordView {
	t.Helper()
	var views []recordView
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var v recordView
		require.NoError(t, json.Unmarshal(sc.Bytes(), &v), sc.Text())
		views = append(views, v)
	}
	return views
}

func hashes(views []recordView) []string {
	var out []string
	for _, v := range views {
		out = append(out, v.KeyHash)
	}
	return out
}

func hashOf(ss ...idem.Scope) []string {
	var out []string
	for _, s := range ss {
		out = append(out, idem.KeyHash(s.Key))
	}
	return out
}

func allKeys() []string {
	return []string{seeded.completed.Key, seeded.stuck.Key, seeded.unknown.Key, seeded.fresh.Key, seeded.expired.Key, seeded.failed.Key, seeded.big.Key}
}

func TestInspectTable(t *testing.T) {
	dir := seededDir(t)
	r := runIdem(t, "", "inspect", "--data", dir)
	require.Equal(t, 0, r.code, r.stderr)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	require.Len(t, lines, 7, r.stdout) // header and the six live records
	assert.Regexp(t, `^TENANT\s+ENDPOINT\s+KEY HASH\s+STATE\s+STATUS\s+AGE\s+EXPIRES IN\s+ATTEMPTS$`, lines[0])
	assert.Regexp(t, `acme\s+POST /v1/payments\s+`+idem.KeyHash(seeded.completed.Key)+`\s+completed\s+201\s+1h30m\s+`, r.stdout)
	assert.Regexp(t, `acme\s+POST /v1/payments\s+`+idem.KeyHash(seeded.stuck.Key)+`\s+in_progress\s+-\s+2h00m\s+`, r.stdout)
	for _, k := range allKeys() {
		assert.NotContains(t, r.stdout, k, "a raw key is shown without --show-keys")
	}
	assert.Equal(t, "6 records\n", r.stderr)

	r = runIdem(t, "", "inspect", "--data", dir, "--show-keys", "--tenant", "acme", "--state", "unknown")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "KEY ")
	assert.Regexp(t, `acme\s+POST /v1/refunds\s+`+seeded.unknown.Key+`\s+unknown\s+-\s+30m00s`, r.stdout)
	assert.Equal(t, "1 records\n", r.stderr)
}

func TestInspectJSONFilters(t *testing.T) {
	dir := seededDir(t)
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"everything live", nil, hashOf(seeded.completed, seeded.stuck, seeded.unknown, seeded.big, seeded.fresh, seeded.failed)},
		{"tenant", []string{"--tenant", "globex"}, hashOf(seeded.big, seeded.fresh, seeded.failed)},
		{"tenant and endpoint", []string{"--tenant", "acme", "--endpoint", "POST /v1/refunds"}, hashOf(seeded.unknown)},
		{"endpoint across tenants", []string{"--endpoint", "POST /v1/refunds"}, hashOf(seeded.unknown, seeded.failed)},
		{"stuck work", []string{"--state", "in_progress", "--older-than", "1h"}, hashOf(seeded.stuck)},
		{"older than", []string{"--older-than", "20m"}, hashOf(seeded.completed, seeded.stuck, seeded.unknown)},
		{"failed", []string{"--state", "FAILED"}, hashOf(seeded.failed)},
		{"with expired", []string{"--tenant", "acme", "--state", "completed", "--expired"}, hashOf(seeded.completed, seeded.expired)},
		// Parts sort by length first (they are length-prefixed), so the
		// shorter endpoint and, within it, the shorter key come first.
		{"limit", []string{"--tenant", "acme", "--limit", "2"}, hashOf(seeded.unknown, seeded.stuck)},
		{"no match", []string{"--tenant", "initech"}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := runIdem(t, "", append([]string{"inspect", "--data", dir, "--json"}, c.args...)...)
			require.Equal(t, 0, r.code, r.stderr)
			views := jsonLines(t, r.stdout)
			assert.ElementsMatch(t, c.want, hashes(views))
			for _, v := range views {
				assert.Empty(t, v.Key)
			}
			assert.Empty(t, r.stderr)
		})
	}

	r := runIdem(t, "", "inspect", "--data", dir, "--json", "--show-keys", "--state", "completed", "--tenant", "acme")
	require.Equal(t, 0, r.code, r.stderr)
	views := jsonLines(t, r.stdout)
	require.Len(t, views, 1)
	v := views[0]
	assert.Equal(t, seeded.completed.Key, v.Key)
	assert.Equal(t, 201, v.Status)
	assert.Equal(t, uint32(1), v.Attempts)
	assert.Equal(t, int64(len(`{"id":"pay_1"}`)), v.BodyBytes)
	assert.Equal(t, idem.Fingerprint{1, 2, 3}.String(), v.Fingerprint)
	assert.WithinDuration(t, time.Now().Add(-90*time.Minute), v.CreatedAt, time.Minute)
}

// TestToolFailures runs every store tool through the mistakes an operator
// makes: each gets a message that says what is wrong and a status that
// says whose mistake it is.
func TestToolFailures(t *testing.T) {
	dir := seededDir(t)
	missing := filepath.Join(t.TempDir(), "nothing-here")
	empty := t.TempDir()
	cases := []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"inspect bad state", []string{"inspect", "--data", dir, "--state", "done"}, 2, `--state "done": want in_progress`},
		{"inspect negative age", []string{"inspect", "--data", dir, "--older-than", "-1m"}, 2, "must not be negative"},
		{"inspect argument", []string{"inspect", "--data", dir, "extra"}, 2, `unexpected argument "extra"`},
		{"inspect unknown flag", []string{"inspect", "--colour"}, 2, "flag provided but not defined"},
		{"inspect missing dir", []string{"inspect", "--data", missing}, 1, "holds no idem store"},
		{"stats empty dir", []string{"stats", "--data", empty}, 1, "holds no idem store"},
		{"get no key", []string{"get", "--data", dir, "--endpoint", "POST /v1/payments"}, 2, "--endpoint and --key are required"},
		{"get key too long", []string{"get", "--data", dir, "--endpoint", "e", "--key", strings.Repeat("k", 300)}, 2, "invalid scope"},
		{"get body and json", []string{"get", "--data", dir, "--endpoint", "e", "--key", "k", "--body", "--json"}, 2, "cannot be combined"},
		{"get absent", []string{"get", "--data", dir, "--endpoint", "POST /v1/payments", "--key", "nope"}, 1, "no record for key hash " + idem.KeyHash("nope")},
		{"get expired", append([]string{"get", "--data", dir}, scopeArgs(seeded.expired)...), 1, "no record for key hash"},
		{"resolve no as", append([]string{"resolve", "--data", dir}, scopeArgs(seeded.stuck)...), 2, `--as "": want released, unknown or completed`},
		{"resolve completed no status", append([]string{"resolve", "--data", dir, "--as", "completed"}, scopeArgs(seeded.stuck)...), 2, "needs --status"},
		{"resolve status without completed", append([]string{"resolve", "--data", dir, "--as", "released", "--status", "200"}, scopeArgs(seeded.stuck)...), 2, "go with --as completed only"},
		{"resolve bad header", append([]string{"resolve", "--data", dir, "--as", "completed", "--status", "200", "--header", "no colon"}, scopeArgs(seeded.stuck)...), 2, `want "Name: value"`},
		{"resolve missing body file", append([]string{"resolve", "--data", dir, "--as", "completed", "--status", "200", "--body-file", missing}, scopeArgs(seeded.stuck)...), 1, "no such file"},
		{"resolve absent", []string{"resolve", "--data", dir, "--as", "released", "--endpoint", "e", "--key", "nope"}, 1, "nothing to resolve"},
		{"resolve completed", append([]string{"resolve", "--data", dir, "--as", "released"}, scopeArgs(seeded.completed)...), 1, "never overwritten"},
		{"resolve live lease", append([]string{"resolve", "--data", dir, "--as", "released"}, scopeArgs(seeded.fresh)...), 1, "lease runs for another"},
		{"compact argument", []string{"compact", "--data", dir, "now"}, 2, `unexpected argument "now"`},
		{"check argument", []string{"check", "--data", dir, "all"}, 2, `unexpected argument "all"`},
		{"check missing dir", []string{"check", "--data", missing}, 1, "holds no idem store"},
		{"keygen bad format", []string{"keygen", "--format", "uuid1"}, 2, `--format "uuid1"`},
		{"keygen zero", []string{"keygen", "-n", "0"}, 2, "-n 0 must be between 1 and"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := runIdem(t, "", c.args...)
			assert.Equal(t, c.code, r.code)
			assert.Empty(t, r.stdout)
			assert.Contains(t, r.stderr, c.stderr)
		})
	}
	_, err := os.Stat(missing)
	assert.True(t, os.IsNotExist(err), "a tool created the data directory it was pointed at")

	// Nothing above changed a record.
	r := runIdem(t, "", "inspect", "--data", dir, "--json", "--expired")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Len(t, jsonLines(t, r.stdout), 7)
}

func scopeArgs(s idem.Scope) []string {
	return []string{"--tenant", s.Tenant, "--endpoint", s.Endpoint, "--key", s.Key}
}

func TestToolsRefuseABusyStore(t *testing.T) {
	dir := seededDir(t)
	db, err := pebblestore.Open(dir, &pebblestore.Options{SweepInterval: -1})
	require.NoError(t, err)
	defer db.Close()
	for _, args := range [][]string{
		{"inspect"}, {"stats"}, {"check"}, {"compact"},
		append([]string{"get"}, scopeArgs(seeded.completed)...),
		append([]string{"resolve", "--as", "released"}, scopeArgs(seeded.stuck)...),
	} {
		t.Run(args[0], func(t *testing.T) {
			r := runIdem(t, "", append(args, "--data", dir)...)
			assert.Equal(t, 1, r.code)
			assert.Empty(t, r.stdout)
			assert.Contains(t, r.stderr, "is in use by another process")
			assert.Contains(t, r.stderr, "stop it (SIGTERM")
		})
	}
	// keygen needs no store at all.
	assert.Equal(t, 0, runIdem(t, "", "keygen").code)
}

func TestGet(t *testing.T) {
	dir := seededDir(t)
	r := runIdem(t, "", append([]string{"get", "--data", dir}, scopeArgs(seeded.completed)...)...)
	require.Equal(t, 0, r.code, r.stderr)
	for _, want := range []string{
		"tenant:       acme\n", "endpoint:     POST /v1/payments\n", "key:          " + seeded.completed.Key + "\n",
		"key hash:     " + idem.KeyHash(seeded.completed.Key) + "\n", "state:        completed\n",
		"fingerprint:  " + idem.Fingerprint{1, 2, 3}.String() + "\n", "attempts:     1\n", "status:       201\n",
		"header:       Content-Type: application/json\n", "body:         14 bytes, sha256 ",
	} {
		assert.Contains(t, r.stdout, want)
	}
	assert.Regexp(t, `created:      \S+ \(1h30m ago\)`, r.stdout)

	r = runIdem(t, "", append([]string{"get", "--data", dir, "--body"}, scopeArgs(seeded.big)...)...)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, string(bigBody), r.stdout, "the chunked body comes back byte for byte")

	r = runIdem(t, "", append([]string{"get", "--data", dir, "--json"}, scopeArgs(seeded.completed)...)...)
	require.Equal(t, 0, r.code, r.stderr)
	var v recordView
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &v))
	assert.Equal(t, seeded.completed.Key, v.Key)
	require.NotNil(t, v.Body)
	assert.JSONEq(t, `{"id":"pay_1"}`, *v.Body)
	assert.Equal(t, []string{"application/json"}, v.Header["Content-Type"])

	r = runIdem(t, "", append([]string{"get", "--data", dir}, scopeArgs(seeded.stuck)...)...)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "state:        in_progress\n")
	assert.NotContains(t, r.stdout, "status:")
}

func TestStats(t *testing.T) {
	dir := seededDir(t)
	r := runIdem(t, "", "stats", "--data", dir, "--json")
	require.Equal(t, 0, r.code, r.stderr)
	var st storeStats
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st))
	assert.Equal(t, int64(6), st.Records)
	assert.Equal(t, map[string]int64{"completed": 2, "in_progress": 2, "unknown": 1, "failed": 1}, st.ByState)
	assert.Equal(t, int64(1), st.Overdue)
	assert.Equal(t, int64(1), st.Expired)
	assert.InDelta(t, (2 * time.Hour).Seconds(), st.OldestInProgress, 60)
	require.NotNil(t, st.DiskBytes)
	assert.Positive(t, *st.DiskBytes)
	assert.NotNil(t, st.ReadAmp)
	assert.Nil(t, st.TableBytes)

	r = runIdem(t, "", "stats", "--data", dir)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Regexp(t, `records\s+6 live\n\s+completed\s+2\n\s+in_progress\s+2\n\s+unknown\s+1\n\s+failed\s+1\n`, r.stdout)
	assert.Regexp(t, `oldest claim\s+2h00m in progress`, r.stdout)
	assert.Regexp(t, `expired\s+1 awaiting sweep`, r.stdout)
	assert.Contains(t, r.stdout, "Needs attention")
}

func TestCompact(t *testing.T) {
	dir := seededDir(t)
	r := runIdem(t, "", "compact", "--data", dir)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Regexp(t, `^swept 1 expired records \(\d+ B\); disk .+ -> .+\n$`, r.stdout)
	// Not a terminal: plain lines, first and last of each phase.
	assert.Equal(t, "sweep: 0/1\nsweep: 1/1\ncompact: 1/4\ncompact: 2/4\ncompact: 3/4\ncompact: 4/4\n", r.stderr)

	r = runIdem(t, "", "inspect", "--data", dir, "--json", "--expired")
	require.Equal(t, 0, r.code, r.stderr)
	assert.NotContains(t, hashes(jsonLines(t, r.stdout)), idem.KeyHash(seeded.expired.Key))
	assert.Len(t, jsonLines(t, r.stdout), 6, "only the expired record is gone")

	r = runIdem(t, "", "compact", "--data", dir)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "swept 0 expired records")
}

// TestEntryBytesOfAVanishedFile: Pebble deletes obsolete files while
// compact adds up the directory, so a file listed and then removed counts
// as empty rather than failing the command (as it once did in CI, on an
// OPTIONS file).
func TestEntryBytesOfAVanishedFile(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "OPTIONS-000001"), make([]byte, 100), 0o644))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1)
	n, err := entryBytes(entries[0])
	require.NoError(t, err)
	assert.Equal(t, int64(100), n)

	require.NoError(t, os.Remove(filepath.Join(dir, "OPTIONS-000001")))
	n, err = entryBytes(entries[0])
	require.NoError(t, err)
	assert.Zero(t, n)
}

func TestProgressBar(t *testing.T) {
	cases := []struct {
		p    idem.CompactProgress
		want string
	}{
		{idem.CompactProgress{Phase: "sweep", Done: 0, Total: 10}, "sweep   [>         ]   0%  0/10"},
		{idem.CompactProgress{Phase: "sweep", Done: 5, Total: 10}, "sweep   [=====>    ]  50%  5/10"},
		{idem.CompactProgress{Phase: "compact", Done: 4, Total: 4}, "compact [==========] 100%  4/4"},
		{idem.CompactProgress{Phase: "sweep", Done: 0, Total: 0}, "sweep   [==========] 100%  0/0"},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, bar(c.p, 10))
	}
}

func TestResolve(t *testing.T) {
	dir := seededDir(t)
	body := filepath.Join(t.TempDir(), "body.json")
	require.NoError(t, os.WriteFile(body, []byte(`{"id":"pay_found_at_provider"}`), 0o644))

	// The stuck claim provably did not happen: free the key.
	r := runIdem(t, "", append([]string{"resolve", "--data", dir, "--as", "released", "--reason", "INC-7: no charge at the provider"}, scopeArgs(seeded.stuck)...)...)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "resolved key hash "+idem.KeyHash(seeded.stuck.Key)+" as released\n", r.stdout)
	assert.Contains(t, r.stderr, `msg="idem resolve: record resolved by an operator" tenant=acme endpoint="POST /v1/payments" key_hash=`+idem.KeyHash(seeded.stuck.Key)+` from=in_progress as=released attempts=1 reason="INC-7: no charge at the provider"`)
	assert.Contains(t, r.stderr, "event=taken_over")
	assert.Contains(t, r.stderr, "event=released")
	assert.Equal(t, 1, runIdem(t, "", append([]string{"get", "--data", dir}, scopeArgs(seeded.stuck)...)...).code, "released: the key is free")

	// The unknown refund did happen: record what the provider says.
	r = runIdem(t, "", append([]string{"resolve", "--data", dir, "--as", "completed", "--status", "201",
		"--header", "content-type: application/json", "--body-file", body}, scopeArgs(seeded.unknown)...)...)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stderr, "from=unknown as=completed attempts=1")
	assert.Contains(t, r.stderr, "status=201 body_bytes=30")
	r = runIdem(t, "", append([]string{"get", "--data", dir, "--json"}, scopeArgs(seeded.unknown)...)...)
	require.Equal(t, 0, r.code, r.stderr)
	var v recordView
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &v))
	assert.Equal(t, "completed", v.State)
	assert.Equal(t, 201, v.Status)
	assert.Equal(t, uint32(2), v.Attempts, "the operator's lease counts as an attempt")
	assert.Equal(t, []string{"application/json"}, v.Header["Content-Type"])
	require.NotNil(t, v.Body)
	assert.Equal(t, `{"id":"pay_found_at_provider"}`, *v.Body)

	// Now completed, it is never overwritten.
	r = runIdem(t, "", append([]string{"resolve", "--data", dir, "--as", "released"}, scopeArgs(seeded.unknown)...)...)
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "never overwritten")

	// A failed record stays spent, but may be marked unknown.
	r = runIdem(t, "", append([]string{"resolve", "--data", dir, "--as", "unknown"}, scopeArgs(seeded.failed)...)...)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stderr, "from=failed as=unknown")

	for _, k := range allKeys() {
		assert.NotContains(t, r.stderr, k, "a raw key reached the log")
	}
}

func TestKeygen(t *testing.T) {
	shapes := map[string]*regexp.Regexp{
		"uuid4": regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`),
		"uuid7": regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`),
		"ulid":  regexp.MustCompile(`^[0-7][0-9A-HJKMNP-TV-Z]{25}$`),
		"token": regexp.MustCompile(`^[A-Za-z0-9_-]{22}$`),
	}
	for format, shape := range shapes {
		t.Run(format, func(t *testing.T) {
			r := runIdem(t, "", "keygen", "--format", format, "-n", "50")
			require.Equal(t, 0, r.code, r.stderr)
			keys := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
			require.Len(t, keys, 50)
			seen := map[string]bool{}
			for _, k := range keys {
				assert.Regexp(t, shape, k)
				assert.Empty(t, strings.Trim(k, idem.DefaultKeyAlphabet), "%q has a character idemhttp refuses", k)
				assert.False(t, seen[k], "%q came twice", k)
				seen[k] = true
			}
		})
	}
	r := runIdem(t, "", "keygen")
	require.Equal(t, 0, r.code)
	assert.Regexp(t, shapes["uuid4"], strings.TrimSuffix(r.stdout, "\n"), "uuid4 is the default")
}

// TestKeygenEncryption: two lines from keygen --encryption make a key
// file that parses, newest last, with distinct keys.
func TestKeygenEncryption(t *testing.T) {
	first := runIdem(t, "", "keygen", "--encryption", "--id", "k1")
	require.Equal(t, 0, first.code, first.stderr)
	before := time.Now().UTC().Format("2006-01-02")
	second := runIdem(t, "", "keygen", "--encryption")
	require.Equal(t, 0, second.code, second.stderr)
	after := time.Now().UTC().Format("2006-01-02")
	assert.NotEqual(t, strings.Fields(first.stdout)[1], strings.Fields(second.stdout)[1])
	k, err := idem.ParseKeyring([]byte(first.stdout + second.stdout))
	require.NoError(t, err)
	ids := k.IDs()
	require.Len(t, ids, 2)
	assert.Equal(t, "k1", ids[0])
	assert.Contains(t, []string{before, after}, ids[1], "today's date is the default id")
	bad := runIdem(t, "", "keygen", "--encryption", "--id", "no/slash")
	assert.Equal(t, 2, bad.code)
}

func TestToolHelp(t *testing.T) {
	for _, name := range []string{"inspect", "get", "stats", "check", "compact", "resolve", "keygen", "migrate"} {
		r := runIdem(t, "", name, "--help")
		assert.Equal(t, 0, r.code, name)
		assert.Contains(t, r.stderr, "usage: idem "+name)
	}
}

// TestProgressOnATerminal drives the bar as a terminal sees it: each step
// redraws the line in place, and a new phase starts a new line.
func TestProgressOnATerminal(t *testing.T) {
	var out strings.Builder
	p := &progress{w: &out, terminal: true}
	p.update(idem.CompactProgress{Phase: "sweep", Done: 0, Total: 2})
	p.update(idem.CompactProgress{Phase: "sweep", Done: 2, Total: 2})
	p.update(idem.CompactProgress{Phase: "compact", Done: 4, Total: 4})
	p.finish()
	assert.Equal(t, "\r"+bar(idem.CompactProgress{Phase: "sweep", Done: 0, Total: 2}, 30)+
		"\r"+bar(idem.CompactProgress{Phase: "sweep", Done: 2, Total: 2}, 30)+
		"\n\r"+bar(idem.CompactProgress{Phase: "compact", Done: 4, Total: 4}, 30)+"\n", out.String())
	assert.False(t, isTerminal(&out), "a buffer is not a terminal")
}
