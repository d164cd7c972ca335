package io.idemd;

import java.util.List;
import java.util.Optional;

/**
 * One page of the abandoned-keys feed. next is the cursor of the next page (give it to {@link
 * AbandonedQuery#withCursor}), empty at the end. A page may hold fewer keys than its limit, even
 * none, and still have a next: idemd bounds the work one page costs, so read until next is empty
 * (or let {@link IdemClient#abandonedKeys} do it).
 */
public record AbandonedPage(List<AbandonedKey> keys, Optional<String> next) {
  public AbandonedPage {
    keys = List.copyOf(keys);
    next = next == null ? Optional.empty() : next;
  }
}
