// Package pebblefs lets idem's own tests and harnesses run the embedded
// store on another filesystem (in memory, crashable, failing on demand)
// while pebblestore's public API names no Pebble type.
package pebblefs

import "github.com/cockroachdb/pebble/v2/vfs"

// Use makes opts, a *pebblestore.Options, open its files through fs.
// Package pebblestore installs it when it is initialized, which any caller
// holding a *pebblestore.Options has made happen.
var Use func(opts any, fs vfs.FS)

// With has opts (nil for the defaults) open its files through fs, and
// returns it.
func With[O any](opts *O, fs vfs.FS) *O {
	if opts == nil {
		opts = new(O)
	}
	Use(opts, fs)
	return opts
}
