package io.idemd.spring;

import io.idemd.IdemClient;
import io.idemd.KeyRing;
import io.idemd.servlet.IdempotencyFilter;
import io.idemd.servlet.Incident;
import jakarta.servlet.http.HttpServletRequest;
import java.security.Principal;
import java.util.function.BiConsumer;
import org.springframework.beans.factory.ObjectProvider;
import org.springframework.boot.autoconfigure.AutoConfiguration;
import org.springframework.boot.autoconfigure.condition.ConditionalOnClass;
import org.springframework.boot.autoconfigure.condition.ConditionalOnMissingBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnProperty;
import org.springframework.boot.autoconfigure.condition.ConditionalOnWebApplication;
import org.springframework.boot.context.properties.EnableConfigurationProperties;
import org.springframework.boot.web.servlet.FilterRegistrationBean;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;

/**
 * An IdemClient from the idemd.* properties (once idemd.url is set), sealing what it stores when
 * idemd.seal.keys and idemd.seal.tenant are set (IDEMD_SEAL_KEYS, IDEMD_SEAL_TENANT), and in a
 * servlet web application the Idempotency-Key filter, registered for
 * idemd.idempotency.url-patterns. The filter needs a scope: an {@link IdempotencyScope} bean, or
 * idemd.idempotency.scope=principal; without either the application does not start. Incidents go to
 * an {@code BiConsumer<HttpServletRequest, Incident>} bean, when there is one.
 */
@AutoConfiguration
@ConditionalOnClass(IdemClient.class)
@ConditionalOnProperty(prefix = "idemd", name = "url")
@EnableConfigurationProperties(IdemdProperties.class)
public class IdemdAutoConfiguration {
  @Bean(destroyMethod = "close")
  @ConditionalOnMissingBean
  public IdemClient idemClient(IdemdProperties properties) {
    IdemClient.Builder b = IdemClient.builder(properties.getUrl()).timeout(properties.getTimeout());
    if (properties.getToken() != null) {
      b.token(properties.getToken());
    }
    if (properties.getOwner() != null) {
      b.owner(properties.getOwner());
    }
    if (properties.getRetention() != null) {
      b.retention(properties.getRetention());
    }
    IdemdProperties.Seal seal = properties.getSeal();
    if (seal.getKeys() != null && !seal.getKeys().isBlank()) {
      if (seal.getTenant() == null || seal.getTenant().isEmpty()) {
        throw new IllegalStateException(
            "idemd: idemd.seal.keys needs idemd.seal.tenant, the tenant the envelopes are bound to"
                + " (the token's tenant; the same in every service of the tenant)");
      }
      KeyRing ring;
      try {
        ring = KeyRing.parse(seal.getKeys());
      } catch (IllegalArgumentException e) {
        // The message names the entry at fault, never the key's bytes.
        throw new IllegalStateException(
            "idemd: idemd.seal.keys is not a key ring: "
                + e.getMessage().replaceFirst("^idem: ", ""),
            e);
      }
      b.sealing(seal.getTenant(), ring).requireSealed(seal.isRequireSealed());
    } else if (seal.isRequireSealed()) {
      throw new IllegalStateException(
          "idemd: idemd.seal.require-sealed needs idemd.seal.keys: without a ring nothing opens");
    }
    return b.build();
  }

  /** The filter, in a servlet web application. */
  @Configuration(proxyBeanMethods = false)
  @ConditionalOnWebApplication(type = ConditionalOnWebApplication.Type.SERVLET)
  @ConditionalOnClass(IdempotencyFilter.class)
  @ConditionalOnProperty(prefix = "idemd.idempotency", name = "enabled", matchIfMissing = true)
  static class Filter {
    @Bean
    @ConditionalOnMissingBean(name = "idempotencyFilter")
    FilterRegistrationBean<IdempotencyFilter> idempotencyFilter(
        IdemClient client,
        IdemdProperties properties,
        ObjectProvider<IdempotencyScope> scopes,
        ObjectProvider<BiConsumer<HttpServletRequest, Incident>> incidents) {
      IdemdProperties.Idempotency p = properties.getIdempotency();
      IdempotencyScope scope = scopes.getIfAvailable();
      if (scope == null) {
        if (!"principal".equals(p.getScope())) {
          // M5: no safe default exists, so the choice is the service's.
          throw new IllegalStateException(
              "idemd: the Idempotency-Key filter needs a scope, naming whose request it is: set"
                  + " idemd.idempotency.scope=principal to use the authenticated principal, declare an"
                  + " IdempotencyScope bean, or set idemd.idempotency.enabled=false");
        }
        scope = IdemdAutoConfiguration::principal;
      }
      IdempotencyScope chosen = scope;
      IdempotencyFilter.Builder b =
          IdempotencyFilter.builder(client)
              .scope(chosen::of)
              .keyPrefix(p.getKeyPrefix())
              .methods(p.getMethods().toArray(new String[0]))
              .requireKey(p.isRequireKey())
              .waitFor(p.getWaitFor())
              .lease(p.getLease())
              .storedHeaders(p.getStoredHeaders().toArray(new String[0]))
              .maxBodyBytes(p.getMaxBodyBytes())
              .maxStoredBytes(p.getMaxStoredBytes())
              .failOpen(p.isFailOpen());
      BiConsumer<HttpServletRequest, Incident> onIncident = incidents.getIfAvailable();
      if (onIncident != null) {
        b.onIncident(onIncident);
      }
      FilterRegistrationBean<IdempotencyFilter> registration =
          new FilterRegistrationBean<>(b.build());
      registration.setName("idempotencyFilter");
      registration.setUrlPatterns(p.getUrlPatterns());
      registration.setOrder(p.getOrder());
      return registration;
    }
  }

  private static String principal(HttpServletRequest request) {
    Principal p = request.getUserPrincipal();
    return p == null ? null : p.getName();
  }
}
