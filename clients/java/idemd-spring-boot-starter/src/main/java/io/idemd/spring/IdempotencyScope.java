package io.idemd.spring;

import jakarta.servlet.http.HttpServletRequest;

/**
 * Whose request it is, for the Idempotency-Key filter: the authenticated user, account or tenant.
 * Declare one as a bean, or set idemd.idempotency.scope=principal to use the request's
 * authenticated principal; the starter refuses to start without either.
 */
@FunctionalInterface
public interface IdempotencyScope {
  /** The scope of request, or null when it cannot tell (the request is answered 500). */
  String of(HttpServletRequest request);
}
