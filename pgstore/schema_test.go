package pgstore_test

import (
	"net/url"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/internal/pgtest"
	"github.com/idemkv/idem/pgstore"
)

// count is the number of rows of table, read on a connection of its own.
func count(t *testing.T, dsn, table string) int {
	t.Helper()
	var n int
	require.NoError(t, connect(t, dsn).QueryRow(t.Context(), "SELECT count(*) FROM "+table).Scan(&n))
	return n
}

// withPath is dsn with a search_path for its connections.
func withPath(dsn, path string) string { return dsn + "&search_path=" + url.PathEscape(path) }

// A decoy table earlier on the search_path of the caller's transaction
// receives nothing: the claim and the completion reach the store's own.
func TestStatementsIgnoreTheSearchPath(t *testing.T) {
	e := newTxEnv(t, nil)
	_, err := e.look.Exec(t.Context(), `CREATE SCHEMA decoy;
CREATE TABLE decoy.idempotency_keys (LIKE public.idempotency_keys INCLUDING ALL)`)
	require.NoError(t, err)

	sc := idem.Scope{Tenant: "t", Endpoint: "POST /pay", Key: "k1"}
	tx := e.begin(t)
	_, err = tx.Exec(t.Context(), "SET LOCAL search_path TO decoy")
	require.NoError(t, err)
	l, rec, err := e.a.ClaimTx(t.Context(), tx, sc, idem.Fingerprint{1})
	require.NoError(t, err)
	require.Nil(t, rec)
	require.NoError(t, l.Complete(t.Context(), idem.Response{Status: 201, Body: []byte("paid")}))
	require.NoError(t, tx.Commit(t.Context()))

	got, err := e.b.Get(t.Context(), sc)
	require.NoError(t, err, "the record is in the store's table")
	assert.Equal(t, []byte("paid"), got.Response.Body)
	assert.Zero(t, count(t, e.dsn, "decoy.idempotency_keys"), "the decoy got nothing")
}

// Two schemas on the search_path that both hold the tables are refused
// at Open rather than one silently hiding the other.
func TestOpenRefusesAmbiguousSchemas(t *testing.T) {
	dsn := pgtest.DSN(t)
	open(t, dsn, nil)
	_, err := connect(t, dsn).Exec(t.Context(), `CREATE SCHEMA decoy;
CREATE TABLE decoy.idempotency_keys (LIKE public.idempotency_keys INCLUDING ALL)`)
	require.NoError(t, err)

	_, err = pgstore.Open(t.Context(), withPath(dsn, "decoy,public"), &pgstore.Options{SweepInterval: -1})
	require.ErrorIs(t, err, pgstore.ErrAmbiguousSchema)
	assert.Contains(t, err.Error(), "decoy, public")

	s := open(t, withPath(dsn, "decoy,public"), &pgstore.Options{Schema: "public"})
	_, err = s.Get(t.Context(), idem.Scope{Tenant: "t", Endpoint: "e", Key: "k"})
	assert.ErrorIs(t, err, idem.ErrNotFound, "an explicit Schema settles it")
}

// Options.Schema puts the tables in that schema, whatever its name; a
// later Open finds them there by the search_path alone.
func TestOptionsSchema(t *testing.T) {
	dsn := pgtest.DSN(t)
	_, err := connect(t, dsn).Exec(t.Context(), `CREATE SCHEMA "pay ""ments"""`)
	require.NoError(t, err)
	_, err = pgstore.Open(t.Context(), dsn, &pgstore.Options{Schema: "absent"})
	require.ErrorIs(t, err, pgstore.ErrNoSchema)

	s := open(t, dsn, &pgstore.Options{Schema: `pay "ments"`})
	sc := idem.Scope{Tenant: "t", Endpoint: "POST /pay", Key: "k1"}
	l, _, err := s.Claim(t.Context(), sc, idem.Fingerprint{1})
	require.NoError(t, err)
	require.NoError(t, l.Complete(t.Context(), idem.Response{Status: 201, Body: []byte("paid")}))
	m, err := s.Metrics(t.Context())
	require.NoError(t, err)
	require.NotEmpty(t, m.Engine)
	assert.Equal(t, "idem_pg_table_bytes", m.Engine[0].Name)
	assert.Positive(t, m.Engine[0].Value, "the table's size is read from the schema")
	_, err = s.Sweep(t.Context())
	require.NoError(t, err)

	assert.Equal(t, 1, count(t, dsn, `"pay ""ments""".idempotency_keys`))
	var public bool
	require.NoError(t, connect(t, dsn).QueryRow(t.Context(), "SELECT to_regclass('public.idempotency_keys') IS NOT NULL").Scan(&public))
	assert.False(t, public, "nothing is created in public")

	again := open(t, withPath(dsn, `public,"pay ""ments"""`), nil)
	got, err := again.Get(t.Context(), sc)
	require.NoError(t, err)
	assert.Equal(t, []byte("paid"), got.Response.Body)
	applied, err := pgstore.Applied(t.Context(), withPath(dsn, `"pay ""ments"""`))
	require.NoError(t, err)
	assert.NotEmpty(t, applied)
}
