// Package blobs3 keeps the blob store (engine.BlobStore) in an S3 bucket, or any store
// that speaks S3 (MinIO, SeaweedFS, Ceph RGW), through the AWS SDK for Go v2.
//
// Credentials come from the SDK's standard chain, never from the URL: the environment
// (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_PROFILE), the
// shared config and credentials files, web identity (IRSA, EKS Pod Identity) and the
// instance's metadata (IMDS).
package blobs3

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"

	"github.com/idemd/idemd/internal/engine"
)

// Options are what a blob store URL says: s3://bucket/prefix?endpoint=...&region=...
// &path_style=true.
type Options struct {
	Bucket string
	// Prefix is put before every name, with a slash after it when it is not empty.
	Prefix string
	// Endpoint is the S3 endpoint's URL, empty for AWS's own.
	Endpoint string
	Region   string
	// PathStyle addresses the bucket in the path (http://host/bucket/name), as MinIO,
	// SeaweedFS and Ceph need, instead of in the host name.
	PathStyle bool
	// Anonymous sends unsigned requests, for a server that needs no credentials.
	Anonymous bool
}

// ParseURL reads an s3:// URL. A URL with credentials in it is refused: they belong
// in the SDK's credential chain, where no log line or metric shows them.
func ParseURL(raw string) (Options, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return Options{}, errors.New("not a URL") // the error would repeat the URL
	}
	if u.Scheme != "s3" {
		return Options{}, fmt.Errorf("scheme %q is not s3", u.Scheme)
	}
	if u.User != nil {
		return Options{}, errors.New("credentials do not go in the URL: give them in the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), the shared credentials file, or the pod's or instance's identity")
	}
	if u.Host == "" {
		return Options{}, errors.New("the URL names no bucket (s3://bucket/prefix)")
	}
	o := Options{Bucket: u.Host, Prefix: strings.Trim(u.Path, "/")}
	q := u.Query()
	for k := range q {
		switch k {
		case "endpoint", "region", "path_style", "anonymous":
		default:
			return Options{}, fmt.Errorf("unknown parameter %q (endpoint, region, path_style, anonymous)", k)
		}
	}
	o.Endpoint, o.Region = q.Get("endpoint"), q.Get("region")
	if o.Endpoint != "" {
		e, err := url.Parse(o.Endpoint)
		switch {
		case err != nil || (e.Scheme != "http" && e.Scheme != "https") || e.Host == "":
			return Options{}, errors.New("endpoint must be an http:// or https:// URL")
		case e.User != nil:
			return Options{}, errors.New("credentials do not go in the endpoint")
		}
	}
	for _, b := range []struct {
		name string
		to   *bool
	}{{"path_style", &o.PathStyle}, {"anonymous", &o.Anonymous}} {
		if v := q.Get(b.name); v != "" {
			if *b.to, err = strconv.ParseBool(v); err != nil {
				return Options{}, fmt.Errorf("%s must be true or false", b.name)
			}
		}
	}
	return o, nil
}

// Store is a blob store in a bucket.
type Store struct {
	client *s3.Client
	o      Options
}

// Open loads the SDK's configuration (its credential chain) and returns the store.
// It does not reach the bucket; Check does.
func Open(ctx context.Context, o Options) (*Store, error) {
	var opts []func(*config.LoadOptions) error
	if o.Region != "" {
		opts = append(opts, config.WithRegion(o.Region))
	}
	if o.Anonymous {
		opts = append(opts, config.WithCredentialsProvider(aws.AnonymousCredentials{}))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("the S3 client's configuration: %w", err)
	}
	if cfg.Region == "" {
		// S3-compatible stores ignore the region, but the SDK signs with one.
		cfg.Region = "us-east-1"
	}
	client := s3.NewFromConfig(cfg, func(so *s3.Options) {
		if o.Endpoint != "" {
			so.BaseEndpoint = aws.String(o.Endpoint)
		}
		so.UsePathStyle = o.PathStyle
		// The blob's own SHA-256 is checked on every read; the SDK's checksums would
		// buffer an unseekable body to compute theirs first.
		so.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		so.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
	})
	return &Store{client: client, o: o}, nil
}

func (s *Store) key(name string) string {
	if s.o.Prefix == "" {
		return name
	}
	return s.o.Prefix + "/" + name
}

// unavailable is a failure of the bucket, with the SDK's error kept as the cause.
func unavailable(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return engine.Unavailable(err)
}

// Check reaches the bucket (HeadBucket).
func (s *Store) Check(ctx context.Context) error {
	if _, err := s.client.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String(s.o.Bucket)}); err != nil {
		return unavailable(ctx, err)
	}
	return nil
}

// Put streams the blob in one PutObject with its length given, hashing it on the way.
func (s *Store) Put(ctx context.Context, name string, r io.Reader, size int64) (engine.BlobRef, error) {
	blob := engine.NewCheckedBlob(r, size)
	_, err := s.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket:        aws.String(s.o.Bucket),
		Key:           aws.String(s.key(name)),
		Body:          blob,
		ContentLength: aws.Int64(size),
		ContentType:   aws.String("application/octet-stream"),
	}, s3.WithAPIOptions(unsignedPayload))
	switch {
	case blob.Err() != nil:
		// The server may have kept what arrived before the client gave up.
		_ = s.Delete(ctx, name)
		return engine.BlobRef{}, blob.Err()
	case err != nil:
		return engine.BlobRef{}, unavailable(ctx, err)
	case blob.Size() != size:
		return engine.BlobRef{}, fmt.Errorf("%w: %d of %d", engine.ErrBlobSize, blob.Size(), size)
	}
	// The upload sent the size it was given; a reader with more than that is a caller's
	// mistake, and its object is not the blob.
	if n, _ := blob.Read(make([]byte, 1)); n > 0 || blob.Err() != nil {
		_ = s.Delete(ctx, name)
		return engine.BlobRef{}, fmt.Errorf("%w: more than %d", engine.ErrBlobSize, size)
	}
	return blob.Ref(name), nil
}

// unsignedPayload signs a PutObject without a hash of its body, which would take a
// second pass over a stream that has none: the body's SHA-256 is idemd's own check.
var unsignedPayload = v4.SwapComputePayloadSHA256ForUnsignedPayloadMiddleware

// Get streams the object; the reader's Size is the object's length as S3 answered it,
// so that a replay can refuse an object of the wrong size before it sends a byte.
func (s *Store) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(s.o.Bucket), Key: aws.String(s.key(name))})
	if err != nil {
		var nsk *types.NoSuchKey
		var api smithy.APIError
		if errors.As(err, &nsk) || (errors.As(err, &api) && api.ErrorCode() == "NotFound") {
			return nil, engine.ErrBlobNotFound
		}
		return nil, unavailable(ctx, err)
	}
	if out.ContentLength == nil {
		return out.Body, nil
	}
	return object{ReadCloser: out.Body, size: *out.ContentLength}, nil
}

// object is an object's body with its length.
type object struct {
	io.ReadCloser
	size int64
}

// Size is the object's length.
func (o object) Size() int64 { return o.size }

// Delete removes the object; S3 answers a missing one as deleted.
func (s *Store) Delete(ctx context.Context, name string) error {
	_, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(s.o.Bucket), Key: aws.String(s.key(name))})
	if err != nil {
		var nsk *types.NoSuchKey
		if errors.As(err, &nsk) {
			return nil
		}
		return unavailable(ctx, err)
	}
	return nil
}

// List pages through ListObjectsV2 from after, in the bucket's (byte) order.
func (s *Store) List(ctx context.Context, after string, fn func(name string) bool) error {
	in := &s3.ListObjectsV2Input{Bucket: aws.String(s.o.Bucket), MaxKeys: aws.Int32(1000)}
	prefix := ""
	if s.o.Prefix != "" {
		prefix = s.o.Prefix + "/"
		in.Prefix = aws.String(prefix)
	}
	if after != "" {
		in.StartAfter = aws.String(prefix + after)
	}
	p := s3.NewListObjectsV2Paginator(s.client, in)
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return unavailable(ctx, err)
		}
		for _, o := range page.Contents {
			if !fn(strings.TrimPrefix(aws.ToString(o.Key), prefix)) {
				return nil
			}
		}
	}
	return nil
}
