package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// byteSize is a flag that counts bytes: a plain number, or one followed by
// a unit in any case. KiB, MiB and GiB (and K, M, G alone) are powers of
// 1024; KB, MB and GB are powers of 1000, as the SI has them.
type byteSize int64

var sizeUnits = []struct {
	suffix string
	n      int64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9},
	{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30},
	{"b", 1},
}

func (s *byteSize) Set(v string) error {
	num, unit := strings.TrimSpace(v), int64(1)
	lower := strings.ToLower(num)
	for _, u := range sizeUnits {
		if strings.HasSuffix(lower, u.suffix) {
			num, unit = strings.TrimSpace(num[:len(num)-len(u.suffix)]), u.n
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	switch {
	case err != nil || n < 0:
		return errors.New("want a number of bytes, optionally with a unit: 512KiB, 4MiB, 1GB")
	case n > (1<<63-1)/unit:
		return errors.New("too large")
	}
	*s = byteSize(n * unit)
	return nil
}

// String spells the size with the largest binary unit that divides it, so
// that defaults read as they are written.
func (s *byteSize) String() string {
	n := int64(*s)
	for _, u := range []struct {
		name string
		n    int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.n == 0 {
			return fmt.Sprintf("%d%s", n/u.n, u.name)
		}
	}
	return strconv.FormatInt(n, 10)
}
