package idem

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// DefaultKeyAlphabet is the characters a key may use under the default
// syntax: those of UUIDs, ULIDs and base64url tokens.
const DefaultKeyAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"

// KeySyntax is the set of idempotency key field values a front end
// accepts: a bare token, or an RFC 8941 Item whose bare item is an
// sf-string, holding 1 to a maximum number of characters of an alphabet.
// Every front end reads keys with one, so that a key is valid on every
// transport or on none. Create one with NewKeySyntax; it is safe for
// concurrent use.
type KeySyntax struct {
	alphabet [256]bool
	text     string
	maxLen   int
}

// NewKeySyntax returns the syntax of keys of at most maxLen characters of
// alphabet; "" selects DefaultKeyAlphabet and 0 selects MaxKeyBytes. An
// alphabet may not hold a character a header value carries only quoted,
// and maxLen is at most MaxKeyBytes. An error matches ErrInvalidOptions.
func NewKeySyntax(alphabet string, maxLen int) (*KeySyntax, error) {
	if alphabet == "" {
		alphabet = DefaultKeyAlphabet
	}
	if maxLen == 0 {
		maxLen = MaxKeyBytes
	}
	k := &KeySyntax{text: alphabet, maxLen: maxLen}
	var problems []string
	for i := 0; i < len(alphabet); i++ {
		c := alphabet[i]
		if c <= ' ' || c >= 0x7f || c == '"' || c == '\\' || c == ',' {
			problems = append(problems, fmt.Sprintf("the key alphabet's %q cannot appear in a header value unquoted", c))
		}
		k.alphabet[c] = true
	}
	if maxLen < 1 || maxLen > MaxKeyBytes {
		problems = append(problems, fmt.Sprintf("the key length %d must be between 1 and %d", maxLen, MaxKeyBytes))
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%w: %s", ErrInvalidOptions, strings.Join(problems, "; "))
	}
	return k, nil
}

// defaultKeys is the default syntax, which ParseKey reads.
var defaultKeys, _ = NewKeySyntax("", 0)

// ParseKey reads an idempotency key field value under the default syntax:
// 1 to MaxKeyBytes characters of DefaultKeyAlphabet.
func ParseKey(v string) (string, error) { return defaultKeys.Parse(v) }

// Parse returns the key that the field value v carries, or why v carries
// none. Blanks around v are ignored.
func (k *KeySyntax) Parse(v string) (string, error) {
	v = strings.Trim(v, " \t")
	key := v
	if strings.HasPrefix(v, `"`) {
		var err error
		if key, err = parseSFItem(v); err != nil {
			return "", err
		}
	}
	switch {
	case key == "":
		return "", errors.New("the idempotency key is empty")
	case len(key) > k.maxLen:
		return "", errors.New("the idempotency key is longer than " + strconv.Itoa(k.maxLen) + " characters")
	}
	for i := 0; i < len(key); i++ {
		if !k.alphabet[key[i]] {
			return "", errors.New("the idempotency key has a character outside " + k.text)
		}
	}
	return key, nil
}

var errBadSFItem = errors.New("the idempotency key is not a valid structured-field string")

// parseSFItem decodes the field as the draft defines it, an RFC 8941 Item
// whose bare item is an sf-string, and returns the string. Parameters are
// checked against the grammar but mean nothing to the key: a client
// library may add its own, and they must not make the key unusable.
func parseSFItem(v string) (string, error) {
	key, rest, ok := cutSFString(v)
	if !ok {
		return "", errBadSFItem
	}
	for rest != "" {
		if rest[0] != ';' {
			return "", errBadSFItem
		}
		rest = strings.TrimLeft(rest[1:], " ")
		n := paramKeyLen(rest)
		if n == 0 {
			return "", errBadSFItem
		}
		rest = rest[n:]
		if strings.HasPrefix(rest, "=") {
			if n = bareItemLen(rest[1:]); n == 0 {
				return "", errBadSFItem
			}
			rest = rest[1+n:]
		}
	}
	return key, nil
}

// cutSFString decodes the sf-string at the start of v (printable ASCII
// between double quotes, where only \" and \\ are escapes) and returns what
// follows it.
func cutSFString(v string) (s, rest string, ok bool) {
	if !strings.HasPrefix(v, `"`) {
		return "", "", false
	}
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		switch c := v[i]; {
		case c == '"':
			return b.String(), v[i+1:], true
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", "", false
			}
			b.WriteByte(v[i])
		case c < 0x20 || c > 0x7e:
			return "", "", false
		default:
			b.WriteByte(c)
		}
	}
	return "", "", false
}

// paramKeyLen returns the length of the parameter key at the start of v
// (lcalpha or "*", then lcalpha, digits, "_", "-", "." and "*"), 0 if
// there is none.
func paramKeyLen(v string) int {
	if v == "" || !(isLower(v[0]) || v[0] == '*') {
		return 0
	}
	n := 1
	for n < len(v) && (isLower(v[n]) || isDigit(v[n]) || strings.IndexByte("_-.*", v[n]) >= 0) {
		n++
	}
	return n
}

// bareItemLen returns the length of the RFC 8941 bare item at the start
// of v (integer, decimal, string, token, byte sequence or boolean), 0 if
// there is none.
func bareItemLen(v string) int {
	switch {
	case v == "":
		return 0
	case v[0] == '-' || isDigit(v[0]):
		return numberLen(v)
	case v[0] == '"':
		_, rest, ok := cutSFString(v)
		if !ok {
			return 0
		}
		return len(v) - len(rest)
	case isAlpha(v[0]) || v[0] == '*':
		n := 1
		for n < len(v) && (isTchar(v[n]) || v[n] == ':' || v[n] == '/') {
			n++
		}
		return n
	case v[0] == ':':
		end := strings.IndexByte(v[1:], ':')
		if end < 0 {
			return 0
		}
		for i := 1; i <= end; i++ {
			if c := v[i]; !(isAlpha(c) || isDigit(c) || c == '+' || c == '/' || c == '=') {
				return 0
			}
		}
		return end + 2
	case v[0] == '?':
		if len(v) > 1 && (v[1] == '0' || v[1] == '1') {
			return 2
		}
	}
	return 0
}

// numberLen returns the length of the sf-integer (at most 15 digits) or
// sf-decimal (at most 12 digits, a dot, 1 to 3 digits) at the start of v,
// 0 if there is none.
func numberLen(v string) int {
	n := 0
	if v[0] == '-' {
		n = 1
	}
	start := n
	for n < len(v) && isDigit(v[n]) {
		n++
	}
	whole := n - start
	if whole == 0 {
		return 0
	}
	if n == len(v) || v[n] != '.' {
		if whole > 15 {
			return 0
		}
		return n
	}
	n++
	frac := n
	for n < len(v) && isDigit(v[n]) {
		n++
	}
	if whole > 12 || n-frac < 1 || n-frac > 3 {
		return 0
	}
	return n
}

func isLower(c byte) bool { return c >= 'a' && c <= 'z' }
func isDigit(c byte) bool { return c >= '0' && c <= '9' }
func isAlpha(c byte) bool { return isLower(c | 0x20) }

// isTchar reports whether c may appear in an RFC 9110 token.
func isTchar(c byte) bool {
	return isAlpha(c) || isDigit(c) || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
