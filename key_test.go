package idem_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
)

// ParseKey is the default syntax, which the front ends share.
func TestParseKey(t *testing.T) {
	for in, want := range map[string]string{
		"A-z_0":                  "A-z_0",
		` "quoted-key_1" `:       "quoted-key_1",
		`"k";v=1;*x="y"`:         "k",
		strings.Repeat("a", 255): strings.Repeat("a", 255),
	} {
		got, err := idem.ParseKey(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got)
	}
	for _, in := range []string{"", `""`, "a.b", "a, b", `"abc`, `"k";V=1`, strings.Repeat("a", 256)} {
		_, err := idem.ParseKey(in)
		assert.Error(t, err, in)
	}
}

func TestKeySyntax(t *testing.T) {
	k, err := idem.NewKeySyntax("ab.", 3)
	require.NoError(t, err)
	for _, in := range []string{"a.b", `"bab"`} {
		_, err := k.Parse(in)
		assert.NoError(t, err, in)
	}
	for _, in := range []string{"abab", "abc", "A"} {
		_, err := k.Parse(in)
		assert.Error(t, err, in)
	}

	_, err = idem.NewKeySyntax("ab c\"", 300)
	require.ErrorIs(t, err, idem.ErrInvalidOptions)
	for _, want := range []string{"' '", `'"'`, "300"} {
		assert.Contains(t, err.Error(), want)
	}
}
