package idem

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/idemd/idemd/clients/go/idemapi"
)

// ImportSummary is what an import of a record stream did.
type ImportSummary struct {
	// Written records were written where the store held none of their keys; Same were
	// there already as they are; Kept were not written because the store holds another
	// record of the key, which it keeps; Expired had run out their retention;
	// OtherTenant were of another tenant than the token's, which lacks the platform
	// scope, and were left out.
	Written, Same, Kept, Expired, OtherTenant int64
	// KeptRecords names the first thousand of Kept.
	KeptRecords []KeptRecord
}

// KeptRecord names a record an import did not write: its tenant, the SHA-256 of its key
// in hex, and the key when the stream carries it.
type KeptRecord struct {
	Tenant, KeySHA256, Key string
}

// ExportRecords writes the record stream of the token's tenant (of every tenant with
// the platform scope, or from an open daemon) to w, and needs the admin scope. It is
// not bounded by WithTimeout, which bounds single calls: ctx bounds it. A stream cut
// short has no trailer, and reading it fails.
func (c *Client) ExportRecords(ctx context.Context, w io.Writer) error {
	resp, err := c.api.ExportRecords(ctx, c.authorize)
	if err != nil {
		return transportError(err)
	}
	if resp.StatusCode != http.StatusOK {
		return decode(resp, nil, http.StatusOK)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(w, resp.Body); err != nil {
		return transportError(err)
	}
	return nil
}

// ImportRecords sends a record stream to the daemon, which writes each record where
// its store holds none of the key's, and needs the admin scope. ctx bounds it.
func (c *Client) ImportRecords(ctx context.Context, stream io.Reader) (ImportSummary, error) {
	resp, err := c.api.ImportRecordsWithBody(ctx, "application/x-ndjson", stream, c.authorize)
	if err != nil {
		return ImportSummary{}, transportError(err)
	}
	var wire idemapi.ImportSummary
	if err := decode(resp, &wire, http.StatusOK); err != nil {
		return ImportSummary{}, err
	}
	sum := ImportSummary{Written: wire.Written, Same: wire.Same, Kept: wire.Kept, Expired: wire.Expired, OtherTenant: wire.OtherTenant}
	if wire.KeptRecords != nil {
		for _, k := range *wire.KeptRecords {
			kept := KeptRecord{Tenant: k.Tenant, KeySHA256: k.KeySha256}
			if k.Key != nil {
				kept.Key = *k.Key
			}
			sum.KeptRecords = append(sum.KeptRecords, kept)
		}
	}
	return sum, nil
}

// BackupCopy describes a copy Backup wrote: its length and SHA-256 in hex, which the
// daemon's trailer confirmed.
type BackupCopy struct {
	Bytes  int64
	SHA256 string
}

// ErrBackupCutShort says that a backup's copy did not arrive whole: no trailer, a
// length or a digest other than the daemon's.
var ErrBackupCutShort = errors.New("idem: the backup did not arrive whole")

// Backup writes a consistent copy of the daemon's embedded store to w and checks it
// against the digest the daemon sends after it; it needs the admin and platform
// scopes. A daemon on Redis refuses it (501, not_supported). ctx bounds it.
func (c *Client) Backup(ctx context.Context, w io.Writer) (BackupCopy, error) {
	resp, err := c.api.Backup(ctx, c.authorize)
	if err != nil {
		return BackupCopy{}, transportError(err)
	}
	if resp.StatusCode != http.StatusOK {
		return BackupCopy{}, decode(resp, nil, http.StatusOK)
	}
	defer resp.Body.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(w, h), resp.Body)
	if err != nil {
		return BackupCopy{}, transportError(err)
	}
	got := BackupCopy{Bytes: n, SHA256: hex.EncodeToString(h.Sum(nil))}
	want := resp.Trailer.Get("Idemd-Backup-Sha256")
	if size := resp.Header.Get("Idemd-Backup-Bytes"); want == "" || want != got.SHA256 || size != strconv.FormatInt(n, 10) {
		return got, fmt.Errorf("%w: %d bytes of %s, SHA-256 %s where the daemon says %q", ErrBackupCutShort, n, size, got.SHA256, want)
	}
	return got, nil
}
