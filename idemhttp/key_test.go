package idemhttp_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/contract"
	"github.com/idemkv/idem/idemhttp"
)

func TestBadKeysAreRefusedAndStoreNothing(t *testing.T) {
	e := setup(t, idemhttp.Options{Aliases: []string{"X-Idempotency-Key"}})
	tests := []struct {
		name string
		keys []string
		code string
	}{
		{"missing", nil, contract.CodeKeyMissing},
		{"empty", []string{""}, contract.CodeKeyInvalid},
		{"blank", []string{"   "}, contract.CodeKeyInvalid},
		{"256 characters", []string{strings.Repeat("a", 256)}, contract.CodeKeyInvalid},
		{"bad alphabet", []string{"key with spaces"}, contract.CodeKeyInvalid},
		{"dot", []string{"a.b"}, contract.CodeKeyInvalid},
		{"non-ASCII", []string{"clé"}, contract.CodeKeyInvalid},
		{"two field lines", []string{"a", "b"}, contract.CodeKeyInvalid},
		{"a list", []string{"a, b"}, contract.CodeKeyInvalid},
		{"broken sf-string", []string{`"abc`}, contract.CodeKeyInvalid},
		{"sf-string with a bad escape", []string{`"a\b"`}, contract.CodeKeyInvalid},
		{"empty sf-string", []string{`""`}, contract.CodeKeyInvalid},
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
		assert.Equal(t, contract.CodeKeyInvalid, problem(t, resp, body).Code)
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
