"""How long each user's replies run, learnt from the replies that end: what the fair queue counts a
request's reply at when it dispatches it (fair_queue.py), before its length is known.

A request's own max_tokens says little: the OpenAI SDK leaves it out and the server fills in the
tier's largest, so counted at max_tokens a user who left it out paid 1,040 KV tokens a turn for a
1-token reply against another's 36, and got 8 replies to its 213. Counted at the user's own average
instead, a user is charged what its replies really take: short replies, short charges; long
replies, a longer wait between turns. Settling each request's real length afterwards was tried
(under the deficit round robin that fair_queue.py replaced): a late charge or refund landed on
whatever turn the user was in (or on none, once its queue emptied), and a user that kept a queue
got refunds that a one-loop user lost.

A user not seen yet is counted at `prior_tokens` (the dispatcher's prior_reply_tokens): one long
reply of another user's set every newcomer's price when a shared average stood in. Never more than
the request's own max_tokens, and a reply cut at a max_tokens below the user's average teaches
nothing: it is charged its cap exactly, and counted, a few requests capped at 1 token pulled the
average down so that the user's long replies cost little (two users after 1,000-token replies, one
also sending five 1-token pings a reply: 183 long replies served against 610). A reply cut before
its own end (a cancel, a hang-up, the drain, its key's end, the token budget: admission/slot.py's
"cut") is a lower bound: it may raise the average, never lower it (`observe_at_least`). Bounded:
the least recently seen users are forgotten.
"""

from __future__ import annotations

from collections import OrderedDict


class ReplyLengths:
    def __init__(self, prior_tokens: int, alpha: float = 0.2, users: int = 65_536) -> None:
        self._prior = float(prior_tokens)
        self._alpha = alpha
        self._users = users
        self._by_user: OrderedDict[str, tuple[float, int]] = OrderedDict()

    def estimate(self, user: str, max_new_tokens: int) -> int:
        """The reply tokens to count for a request of this user's, before it has run."""
        return min(max_new_tokens, round(self._average(user)))

    def observe(self, user: str, generated: int, max_new_tokens: int) -> None:
        """One of this user's replies, allowed `max_new_tokens`, ended with `generated` tokens."""
        if generated >= max_new_tokens and max_new_tokens < round(self._average(user)):
            return  # cut by its own small cap: says nothing of how long the user's replies run
        average, samples = self._by_user.pop(user, (float(generated), 0))
        samples += 1
        self._by_user[user] = (_step(average, generated, self._alpha, samples), samples)
        if len(self._by_user) > self._users:
            self._by_user.popitem(last=False)

    def observe_at_least(self, user: str, generated: int, max_new_tokens: int) -> None:
        """One of this user's replies was cut `generated` tokens in (a cancel, a disconnect, the
        token budget): it would have run at least that long, so it may raise the user's average,
        never lower it. Learnt as the reply's length, cancels and hang-ups (most often early in a
        long reply) made the user's replies look short: priced low in the fair queue, the running
        ones expected to end at once (running_ends.py), a lease asked for too few tokens."""
        if generated > self._average(user):
            self.observe(user, generated, max_new_tokens)

    def _average(self, user: str) -> float:
        seen = self._by_user.get(user)
        return self._prior if seen is None else seen[0]


def _step(average: float, sample: int, alpha: float, samples: int) -> float:
    # Warm start, as ServiceRate: the first samples are averaged plainly, so a wrong prior goes at once.
    return average + max(alpha, 1.0 / samples) * (sample - average)
