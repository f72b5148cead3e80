package idemhttp_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemhttp"
)

func TestBadKeysAreRefusedAndStoreNothing(t *testing.T) {
	e := setup(t, idemhttp.Options{Aliases: []string{"X-Idempotency-Key"}})
	tests := []struct {
		name string
		keys []string
		code string
	}{
		{"missing", nil, idem.CodeKeyMissing},
		{"empty", []string{""}, idem.CodeKeyInvalid},
		{"blank", []string{"   "}, idem.CodeKeyInvalid},
		{"256 characters", []string{strings.Repeat("a", 256)}, idem.CodeKeyInvalid},
		{"bad alphabet", []string{"key with spaces"}, idem.CodeKeyInvalid},
		{"dot", []string{"a.b"}, idem.CodeKeyInvalid},
		{"non-ASCII", []string{"clé"}, idem.CodeKeyInvalid},
		{"two field lines", []string{"a", "b"}, idem.CodeKeyInvalid},
		{"a list", []string{"a, b"}, idem.CodeKeyInvalid},
		{"broken sf-string", []string{`"abc`}, idem.CodeKeyInvalid},
		{"sf-string with a bad escape", []string{`"a\b"`}, idem.CodeKeyInvalid},
		{"empty sf-string", []string{`""`}, idem.CodeKeyInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := e.call("POST", "/v1/payments", "acme", pay, tt.keys...)
			assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
			assert.Equal(t, tt.code, problem(t, resp, body).Code)
		})
	}
	t.Run("standard name and alias together", func(t *testing.T) {
		resp, body := e.callWith(http.Header{"X-Idempotency-Key": {"a"}}, "POST", "/v1/payments", "acme", pay, "a")
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
		assert.Equal(t, idem.CodeKeyInvalid, problem(t, resp, body).Code)
	})
	assert.Zero(t, e.app.runs.Load())
	m, err := e.db.Metrics(context.Background())
	require.NoError(t, err)
	assert.Zero(t, m.Events[idem.EventClaimed], "nothing was claimed")

	// The limits are inclusive, and both forms of the header work.
	for _, k := range []string{strings.Repeat("a", 255), `"quoted-key_1"`, "A-z_0"} {
		resp, _ := e.call("POST", "/v1/payments", "acme", pay, k)
		assert.Equal(t, http.StatusCreated, resp.StatusCode, k)
	}
	resp, _ := e.call("POST", "/v1/payments", "acme", pay, "quoted-key_1")
	assert.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"), "an sf-string names the same key as the bare token")
}

func TestAliasHeader(t *testing.T) {
	e := setup(t, idemhttp.Options{Aliases: []string{"X-Idempotency-Key"}})
	for range 2 {
		resp, _ := e.callWith(http.Header{"X-Idempotency-Key": {"via-alias"}}, "POST", "/v1/payments", "acme", pay)
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
	}
	assert.Equal(t, int64(1), e.app.runs.Load())
}

// TestKeyWithParameters: the key is an RFC 8941 Item, so an sf-string may
// carry parameters; the key is the string, whatever they say. Parameters
// that break the grammar make the whole field malformed.
func TestKeyWithParameters(t *testing.T) {
	e := setup(t, idemhttp.Options{})
	good := []string{
		`"k";v=1`, `"k";a;b=?0`, `"k"; a=?1`, `"k";a=-12;b=3.25;c=-0.5`,
		`"k";a="x \" y"`, `"k";a=tok/en:1*`, `"k";a=*t`, `"k";a=:aGk=:`, `"k";*a_b-c.d*9=1`,
		`"k";a=1;a=2`, `"k";v=1  `,
	}
	first, _ := e.call("POST", "/v1/payments", "acme", pay, "k")
	require.Equal(t, http.StatusCreated, first.StatusCode)
	for _, v := range good {
		resp, body := e.call("POST", "/v1/payments", "acme", pay, v)
		assert.Equal(t, http.StatusCreated, resp.StatusCode, "%s: %s", v, body)
		assert.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"), "%s names the key k", v)
	}
	bad := []string{
		`"k";`, `"k";;a`, `"k" ;a`, `"k";A=1`, `"k";1a`, `"k";_a`, `"k";a=`, `"k";a==1`,
		`"k";a=?2`, `"k";a=?`, `"k";a=1234567890123456`, `"k";a=1.2345`, `"k";a=1234567890123.1`,
		`"k";a=1.`, `"k";a=-`, `"k";a="x`, `"k";a=:a-b:`, `"k";a=:aGk=`, `"k";a=@1`, `"k";a=%"x"`,
		`"k";a=1 b`, `"k"x`, `"k";a=1,`, "\"k\";\ta", `"k";a=b c`, `"k";a=tok"en`,
	}
	for _, v := range bad {
		resp, body := e.call("POST", "/v1/payments", "acme", pay, v)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, v)
		assert.Equal(t, idem.CodeKeyInvalid, problem(t, resp, body).Code, v)
	}
	assert.Equal(t, int64(1), e.app.runs.Load())
}
