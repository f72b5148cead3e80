package idem_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
)

// keyring parses a key file of the given key ids, each a fresh key.
func keyring(t testing.TB, ids ...string) (*idem.Keyring, string) {
	t.Helper()
	var lines []string
	for _, id := range ids {
		line, err := idem.NewKeyLine(id)
		require.NoError(t, err)
		lines = append(lines, line)
	}
	file := "# keys, newest last\n\n" + strings.Join(lines, "\n") + "\n"
	k, err := idem.ParseKeyring([]byte(file))
	require.NoError(t, err)
	return k, file
}

func TestSealOpens(t *testing.T) {
	k, _ := keyring(t, "k1")
	ctx := idem.SealContext(scope("a"), "body")
	sealed := k.Seal([]byte(`{"card":"4242"}`), ctx)
	assert.NotContains(t, string(sealed), "4242")
	plain, err := k.Open(sealed, ctx)
	require.NoError(t, err)
	assert.Equal(t, `{"card":"4242"}`, string(plain))
	assert.NotEqual(t, sealed, k.Seal([]byte(`{"card":"4242"}`), ctx), "every seal has its own nonce")
}

// A sealed value moved to another record, tenant, field, or cut short,
// does not open, and says it is corrupt rather than returning garbage.
func TestSealedValueBoundToItsPlace(t *testing.T) {
	k, _ := keyring(t, "k1")
	at := scope("a")
	sealed := k.Seal([]byte("secret"), idem.SealContext(at, "body"))
	other := at
	other.Tenant = "globex"
	for name, ctx := range map[string][]byte{
		"another key":    idem.SealContext(scope("b"), "body"),
		"another tenant": idem.SealContext(other, "body"),
		"another field":  idem.SealContext(at, "header"),
	} {
		_, err := k.Open(sealed, ctx)
		assert.ErrorIs(t, err, idem.ErrCorrupt, name)
	}
	for _, n := range []int{0, 1, 2, 5, len(sealed) - 1} {
		_, err := k.Open(sealed[:n], idem.SealContext(at, "body"))
		assert.ErrorIs(t, err, idem.ErrCorrupt, "cut to %d bytes", n)
	}
	flipped := append([]byte(nil), sealed...)
	flipped[len(flipped)-1] ^= 1
	_, err := k.Open(flipped, idem.SealContext(at, "body"))
	assert.ErrorIs(t, err, idem.ErrCorrupt)
}

// Rotation: the newest key seals, an older key listed still opens what it
// sealed, and a ring without it names the missing id.
func TestKeyRotation(t *testing.T) {
	old, oldFile := keyring(t, "2026-01")
	ctx := idem.SealContext(scope("a"), "body")
	sealed := old.Seal([]byte("paid"), ctx)

	line, err := idem.NewKeyLine("2026-06")
	require.NoError(t, err)
	both, err := idem.ParseKeyring([]byte(oldFile + line + "\n"))
	require.NoError(t, err)
	assert.Equal(t, "2026-06", both.Newest())
	assert.Equal(t, []string{"2026-01", "2026-06"}, both.IDs())
	plain, err := both.Open(sealed, ctx)
	require.NoError(t, err)
	assert.Equal(t, "paid", string(plain))
	id, _, err := idem.SealedKeyID(both.Seal([]byte("x"), ctx))
	require.NoError(t, err)
	assert.Equal(t, "2026-06", id)

	newOnly, err := idem.ParseKeyring([]byte(line))
	require.NoError(t, err)
	_, err = newOnly.Open(sealed, ctx)
	assert.ErrorIs(t, err, idem.ErrKeyMissing)
	assert.Contains(t, err.Error(), `"2026-01"`)
}

// A key file with a bad line is refused with the line's number and never
// the key material on it.
func TestKeyFileRefused(t *testing.T) {
	good, err := idem.NewKeyLine("k1")
	require.NoError(t, err)
	material := strings.Fields(good)[1]
	for name, file := range map[string]string{
		"empty":          "",
		"comments only":  "# nothing\n",
		"no key":         "k1\n",
		"bad id":         "k/1 " + material + "\n",
		"long id":        strings.Repeat("k", 33) + " " + material + "\n",
		"short key":      "k1 " + material[:20] + "\n",
		"not base64":     "k1 " + strings.Repeat("!", 44) + "\n",
		"listed twice":   good + "\n" + good + "\n",
		"key of 16 byte": "k1 AAAAAAAAAAAAAAAAAAAAAA==\n",
	} {
		_, err := idem.ParseKeyring([]byte(file))
		require.ErrorIs(t, err, idem.ErrKeyFile, name)
		assert.NotContains(t, err.Error(), material, name)
	}
	_, err = idem.ParseKeyring([]byte("# the key\n" + "k1 " + material[:20] + "\n"))
	assert.Contains(t, err.Error(), "line 2")
	_, err = idem.NewKeyLine("bad id")
	assert.ErrorIs(t, err, idem.ErrInvalidOptions)
}

func TestReadKeyringRefusesOpenFiles(t *testing.T) {
	_, file := keyring(t, "k1")
	path := filepath.Join(t.TempDir(), "keys")
	require.NoError(t, os.WriteFile(path, []byte(file), 0o644))
	_, err := idem.ReadKeyring(path)
	assert.ErrorIs(t, err, idem.ErrKeyFile, "a key file others may read")
	require.NoError(t, os.Chmod(path, 0o600))
	k, err := idem.ReadKeyring(path)
	require.NoError(t, err)
	assert.Equal(t, "k1", k.Newest())
	_, err = idem.ReadKeyring(filepath.Join(t.TempDir(), "none"))
	assert.ErrorIs(t, err, idem.ErrKeyFile)
}

func TestSealContextIsInjective(t *testing.T) {
	a := idem.SealContext(idem.Scope{Tenant: "ab", Endpoint: "c", Key: "k"}, "body")
	b := idem.SealContext(idem.Scope{Tenant: "a", Endpoint: "bc", Key: "k"}, "body")
	assert.NotEqual(t, a, b)
}
