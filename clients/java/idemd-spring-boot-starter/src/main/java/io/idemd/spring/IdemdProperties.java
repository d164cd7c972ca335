package io.idemd.spring;

import io.idemd.servlet.IdempotencyFilter;
import java.time.Duration;
import java.util.List;
import org.springframework.boot.context.properties.ConfigurationProperties;

/** The idemd.* properties. */
@ConfigurationProperties("idemd")
public class IdemdProperties {
  /** The idemd to talk to, such as http://idemd.internal:8080. */
  private String url;

  /** An API token, sent as Authorization: Bearer, for a daemon with an auth file. */
  private String token;

  /** Bounds each call, resends included. */
  private Duration timeout = Duration.ofSeconds(10);

  /** The owner label of this service's claims, shown by lookups. */
  private String owner;

  /** How long results are kept; unset keeps the daemon's default (24 h). */
  private Duration retention;

  private final Idempotency idempotency = new Idempotency();

  private final Seal seal = new Seal();

  public String getUrl() {
    return url;
  }

  public void setUrl(String url) {
    this.url = url;
  }

  public String getToken() {
    return token;
  }

  public void setToken(String token) {
    this.token = token;
  }

  public Duration getTimeout() {
    return timeout;
  }

  public void setTimeout(Duration timeout) {
    this.timeout = timeout;
  }

  public String getOwner() {
    return owner;
  }

  public void setOwner(String owner) {
    this.owner = owner;
  }

  public Duration getRetention() {
    return retention;
  }

  public void setRetention(Duration retention) {
    this.retention = retention;
  }

  public Idempotency getIdempotency() {
    return idempotency;
  }

  public Seal getSeal() {
    return seal;
  }

  /**
   * The idemd.seal.* properties: the sealing of the results and recovery points this service stores
   * (docs/sealing.md), off while no keys are set. As environment variables they are
   * IDEMD_SEAL_KEYS, IDEMD_SEAL_TENANT and IDEMD_SEAL_REQUIRE_SEALED.
   */
  public static class Seal {
    /**
     * The key ring in its text form: entries id=base64 of 32 random bytes, separated by commas or
     * newlines, the first of which seals. A secret: hand it over from a secret store.
     */
    private String keys;

    /** The tenant the envelopes are bound to (the token's tenant); required with keys. */
    private String tenant;

    /** Whether plain results and recovery points are refused (not_sealed) instead of passed on. */
    private boolean requireSealed;

    public String getKeys() {
      return keys;
    }

    public void setKeys(String keys) {
      this.keys = keys;
    }

    public String getTenant() {
      return tenant;
    }

    public void setTenant(String tenant) {
      this.tenant = tenant;
    }

    public boolean isRequireSealed() {
      return requireSealed;
    }

    public void setRequireSealed(boolean requireSealed) {
      this.requireSealed = requireSealed;
    }

    /** The keys stay out of logs. */
    @Override
    public String toString() {
      return "Seal[tenant="
          + tenant
          + ", keys="
          + (keys == null || keys.isBlank() ? "none" : "set")
          + ", requireSealed="
          + requireSealed
          + "]";
    }
  }

  /**
   * The idemd.idempotency.* properties: the Idempotency-Key filter (docs/middleware.md, Options).
   */
  public static class Idempotency {
    /** Whether the filter is registered in a servlet web application. */
    private boolean enabled = true;

    /**
     * principal: the scope is the authenticated principal's name (request.getUserPrincipal()).
     * Unset, an IdempotencyScope bean is required.
     */
    private String scope;

    /**
     * Put before every idemd key the filter derives, such as "orders/", so that the abandoned-keys
     * feed and a Completer select this service's keys by it; empty for none.
     */
    private String keyPrefix = "";

    private List<String> methods = IdempotencyFilter.DEFAULT_METHODS;
    private boolean requireKey;
    private Duration waitFor = Duration.ZERO;
    private Duration lease = IdempotencyFilter.DEFAULT_LEASE;
    private List<String> storedHeaders = IdempotencyFilter.DEFAULT_STORED_HEADERS;
    private int maxBodyBytes = IdempotencyFilter.DEFAULT_MAX_BODY_BYTES;
    private int maxStoredBytes = IdempotencyFilter.DEFAULT_MAX_STORED_BYTES;
    private boolean failOpen;

    /** The URL patterns the filter applies to. */
    private List<String> urlPatterns = List.of("/*");

    /**
     * The filter's order: after Spring Security's filter chain (-100), which gives the principal.
     */
    private int order;

    public boolean isEnabled() {
      return enabled;
    }

    public void setEnabled(boolean enabled) {
      this.enabled = enabled;
    }

    public String getScope() {
      return scope;
    }

    public void setScope(String scope) {
      this.scope = scope;
    }

    public String getKeyPrefix() {
      return keyPrefix;
    }

    public void setKeyPrefix(String keyPrefix) {
      this.keyPrefix = keyPrefix;
    }

    public List<String> getMethods() {
      return methods;
    }

    public void setMethods(List<String> methods) {
      this.methods = methods;
    }

    public boolean isRequireKey() {
      return requireKey;
    }

    public void setRequireKey(boolean requireKey) {
      this.requireKey = requireKey;
    }

    public Duration getWaitFor() {
      return waitFor;
    }

    public void setWaitFor(Duration waitFor) {
      this.waitFor = waitFor;
    }

    public Duration getLease() {
      return lease;
    }

    public void setLease(Duration lease) {
      this.lease = lease;
    }

    public List<String> getStoredHeaders() {
      return storedHeaders;
    }

    public void setStoredHeaders(List<String> storedHeaders) {
      this.storedHeaders = storedHeaders;
    }

    public int getMaxBodyBytes() {
      return maxBodyBytes;
    }

    public void setMaxBodyBytes(int maxBodyBytes) {
      this.maxBodyBytes = maxBodyBytes;
    }

    public int getMaxStoredBytes() {
      return maxStoredBytes;
    }

    public void setMaxStoredBytes(int maxStoredBytes) {
      this.maxStoredBytes = maxStoredBytes;
    }

    public boolean isFailOpen() {
      return failOpen;
    }

    public void setFailOpen(boolean failOpen) {
      this.failOpen = failOpen;
    }

    public List<String> getUrlPatterns() {
      return urlPatterns;
    }

    public void setUrlPatterns(List<String> urlPatterns) {
      this.urlPatterns = urlPatterns;
    }

    public int getOrder() {
      return order;
    }

    public void setOrder(int order) {
      this.order = order;
    }
  }
}
