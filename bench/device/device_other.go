//go:build !linux

package device

// Local returns this machine's view. Outside Linux there are no device
// statistics to read: its Find returns a *NoDeviceError for every path.
func Local() Host {
	return Host{Root: "/", DevOf: func(string) (uint32, uint32, error) {
		return 0, 0, &NoDeviceError{"n/a", "block device statistics are read on Linux only"}
	}}
}

// SyncAll does nothing outside Linux, where no counter is read.
func SyncAll() {}
