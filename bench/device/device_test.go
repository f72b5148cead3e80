package device

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const testDiskstats = `   7       0 loop0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
 254       0 vda 1978284 130900 40773794 1824049 22907702 906889 782598776 3160572 0 1670672 5791621 931754 57 580009288 126739 9250686 680260
 254       1 vda1 1000 10 20000 300 4000 50 123456 700 0 800 900 0 0 0 0 0 0
 253       0 dm-0 5 0 40 1 6 0 4242 2 0 3 3
`

func TestParseDiskstats(t *testing.T) {
	for _, tc := range []struct {
		major, minor uint32
		want         uint64
	}{
		{254, 0, 782598776}, // the whole disk
		{254, 1, 123456},    // its partition counts its own writes
		{253, 0, 4242},      // an old kernel's eleven fields
		{7, 0, 0},
	} {
		n, found, err := parseDiskstats(testDiskstats, tc.major, tc.minor)
		require.NoError(t, err)
		assert.True(t, found, "%d:%d", tc.major, tc.minor)
		assert.Equal(t, tc.want, n, "%d:%d", tc.major, tc.minor)
	}
	_, found, err := parseDiskstats(testDiskstats, 254, 2)
	require.NoError(t, err)
	assert.False(t, found)
	_, _, err = parseDiskstats(" 8 0 sda 1 2 3\n", 8, 0)
	assert.Error(t, err, "too few fields")
	_, _, err = parseDiskstats(" 8 0 sda 1 2 3 4 5 6 x 8\n", 8, 0)
	assert.Error(t, err, "not a number")

	n, err := parseBlockStat("    1000   10  20000  300  4000  50  99  700  0  800  900\n")
	require.NoError(t, err)
	assert.Equal(t, uint64(99), n)
	_, err = parseBlockStat("1 2 3")
	assert.Error(t, err)
}

// fakeHost builds a /proc and /sys under a temporary directory, with these
// mounts: an ext4 partition at /, a tmpfs at /dev/shm, btrfs (anonymous
// device numbers) from /dev/vdb2 at /srv and from a device-mapper volume
// at /mnt/lv, and an overlay at /ctr whose upper directory is on /.
func fakeHost(t *testing.T) Host {
	root := t.TempDir()
	write := func(name, text string) {
		p := filepath.Join(root, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(text), 0o644))
	}
	link := func(name, target string) {
		p := filepath.Join(root, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.Symlink(target, p))
	}
	write("proc/diskstats", testDiskstats+" 252      18 vdb2 1 0 8 0 2 0 777 0 0 0 0\n")
	write("proc/self/mountinfo", strings.Join([]string{
		`27 1 254:1 / / rw,relatime - ext4 /dev/vda1 rw`,
		`30 27 0:27 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=1024k`,
		`31 27 0:40 /@srv /srv rw shared:5 - btrfs /dev/vdb2 rw,subvol=/@srv`,
		`32 31 0:40 /@srv/deep /srv/deep\040dir rw - btrfs /dev/vdb2 rw,subvol=/@srv/deep`,
		`33 27 0:41 / /mnt/lv rw - btrfs /dev/mapper/vg-data rw`,
		`34 27 0:50 / /ctr rw - overlay overlay rw,lowerdir=/l,upperdir=/var/lib/ctr/upper,workdir=/var/lib/ctr/work`,
		`35 27 0:51 / /ctr2 rw - overlay overlay rw,lowerdir=/l,upperdir=/gone/upper,workdir=/gone/work`,
	}, "\n")+"\n")
	link("sys/dev/block/254:0", "../../devices/pci0000:00/virtio1/block/vda")
	link("sys/dev/block/254:1", "../../devices/pci0000:00/virtio1/block/vda/vda1")
	write("sys/class/block/vdb2/dev", "252:18\n")
	write("sys/class/block/dm-0/dev", "253:0\n")
	write("sys/block/dm-0/dm/name", "vg-data\n")
	write("sys/dev/block/253:0/stat", "5 0 40 1 6 0 4242 2 0 3 3\n")
	devs := map[string][2]uint32{
		"/data":                 {254, 1},
		"/var/lib/ctr/upper":    {254, 1},
		"/dev/shm/x":            {0, 27},
		"/srv/db":               {0, 40},
		"/srv/deep dir/db":      {0, 40},
		"/mnt/lv/db":            {0, 41},
		"/ctr/db":               {0, 50},
		"/ctr2/db":              {0, 51},
		"/odd":                  {253, 0}, // no sysfs link: named from diskstats
		"/unlisted":             {8, 99},
		"/anonymous-not-listed": {0, 99},
	}
	return Host{Root: root, DevOf: func(path string) (uint32, uint32, error) {
		d, ok := devs[path]
		if !ok {
			return 0, 0, os.ErrNotExist
		}
		return d[0], d[1], nil
	}}
}

func TestFind(t *testing.T) {
	h := fakeHost(t)
	for path, want := range map[string]Device{
		"/data":            {254, 1, "vda1"},
		"/srv/db":          {252, 18, "vdb2"},
		"/srv/deep dir/db": {252, 18, "vdb2"},
		"/mnt/lv/db":       {253, 0, "dm-0"},
		"/ctr/db":          {254, 1, "vda1"}, // the overlay's upper directory
		"/odd":             {253, 0, "dm-0"},
	} {
		got, err := h.Find(path)
		if assert.NoError(t, err, path) {
			assert.Equal(t, want, got, path)
		}
	}
	for path, short := range map[string]string{
		"/dev/shm/x":            "n/a (tmpfs)",
		"/ctr2/db":              "n/a (overlay)",
		"/unlisted":             "n/a (8:99)",
		"/anonymous-not-listed": "n/a (0:99)",
	} {
		_, err := h.Find(path)
		var nd *NoDeviceError
		if assert.True(t, errors.As(err, &nd), "%s: %v", path, err) {
			assert.Equal(t, short, nd.Short, path)
		}
	}
	_, err := h.Find("/missing")
	assert.ErrorIs(t, err, os.ErrNotExist)
}

func TestSectorsWritten(t *testing.T) {
	h := fakeHost(t)
	n, err := h.SectorsWritten(Device{254, 1, "vda1"})
	require.NoError(t, err)
	assert.Equal(t, uint64(123456), n)

	// Without /proc/diskstats the device's sysfs stat file answers.
	require.NoError(t, os.Remove(filepath.Join(h.Root, "proc/diskstats")))
	n, err = h.SectorsWritten(Device{253, 0, "dm-0"})
	require.NoError(t, err)
	assert.Equal(t, uint64(4242), n)
	_, err = h.SectorsWritten(Device{254, 1, "vda1"})
	assert.Error(t, err)
}

func TestDevicesDeduplicates(t *testing.T) {
	h := fakeHost(t)
	ds, err := h.Devices([]string{"/data", "/var/lib/ctr/upper", "/srv/db/not-yet"})
	require.NoError(t, err)
	assert.Equal(t, []Device{{254, 1, "vda1"}, {252, 18, "vdb2"}}, ds)
}

// TestFindHere looks up this machine's own temporary directory: it
// is on a device whose counter reads, or has a reason why not.
func TestFindHere(t *testing.T) {
	h := Local()
	d, err := h.Find(t.TempDir())
	var nd *NoDeviceError
	if errors.As(err, &nd) {
		assert.True(t, strings.HasPrefix(nd.Short, "n/a"), nd.Short)
		return
	}
	require.NoError(t, err)
	assert.NotEmpty(t, d.Name)
	_, err = h.SectorsWritten(d)
	assert.NoError(t, err)
}
