// A chat frontend of its own, on its own origin, calling memsvc's /v1/user API from the
// browser with a bearer JWT (`memsvc token alice`). No build step, no dependencies.
// memsvc must list this page's origin in MEMSVC_CORS_ALLOWED_ORIGINS (see README.md).

const $ = (selector) => document.querySelector(selector);

const state = {
  server: localStorage.getItem("memsvc.server") || "",
  // The token stays for this tab only.
  token: sessionStorage.getItem("memsvc.token") || "",
  conversationId: null,
  opening: 0, // which openConversation() is the latest: an earlier one ending later is dropped
};

// --- The API ---------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(message, status, code) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function api(method, path, body, extraHeaders = {}) {
  const headers = { Authorization: `Bearer ${state.token}`, ...extraHeaders };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(state.server + path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: "omit", // the token is the credential: no cookies
    });
  } catch (error) {
    // The browser hides why: the server is down, or it did not grant this origin (CORS).
    throw new ApiError(
      `Cannot reach ${state.server} (${error.message}). Is memsvc running, and is ` +
        `${location.origin} in its MEMSVC_CORS_ALLOWED_ORIGINS?`,
      0,
      "network",
    );
  }
  if (response.status === 204) return null;
  const data = await response.json().catch(() => null);
  if (!response.ok) {
    // memsvc's one error shape: {"error": "...", "code": "...", "details": {...}}
    let message = data?.error ?? `HTTP ${response.status}`;
    const retryAfter = response.headers.get("Retry-After");
    if (retryAfter) message += ` (try again in ${retryAfter} s)`;
    // What to quote when reporting it: memsvc's log lines about the request name this id.
    const requestId = response.headers.get("X-Request-Id");
    const named = requestId ? ` (request ${requestId})` : "";
    throw new ApiError(`${message} [${response.status} ${data?.code ?? ""}]${named}`, response.status, data?.code);
  }
  return data;
}

// A create sent again after its answer was lost (the connection dropped: did it happen?)
// must not make a second one: the same action on the same input carries the same
// Idempotency-Key until it succeeds, and memsvc answers the retry with what the first made.
async function create(form, path, body) {
  const sent = JSON.stringify([path, body]);
  if (form.dataset.sent !== sent) {
    form.dataset.sent = sent;
    form.dataset.key = crypto.randomUUID();
  }
  const made = await api("POST", path, body, { "Idempotency-Key": form.dataset.key });
  delete form.dataset.sent;
  delete form.dataset.key;
  return made;
}

const conversationPath = (id, rest = "") => `/v1/user/conversations/${encodeURIComponent(id)}${rest}`;

async function allPages(path) {
  const items = [];
  let cursor = null;
  do {
    const separator = path.includes("?") ? "&" : "?";
    const query = cursor ? `${separator}limit=200&after=${encodeURIComponent(cursor)}` : `${separator}limit=200`;
    const page = await api("GET", path + query);
    items.push(...page.data);
    cursor = page.nextCursor;
  } while (cursor);
  return items;
}

// --- What the page shows ---------------------------------------------------------------------

function element(tag, properties = {}, ...children) {
  const node = Object.assign(document.createElement(tag), properties);
  node.append(...children); // text stays text: nothing from the API is parsed as HTML
  return node;
}

function showError(error) {
  $("#error").textContent = error ? error.message : "";
}

// Every action: clear the last error, run, show the API's message when it fails. A form or
// button whose action runs (``handler(event, itself)``) takes no second one meanwhile.
function action(handler) {
  return async (event) => {
    event?.preventDefault();
    const source = event?.currentTarget;
    if (source?.dataset.busy) return;
    if (source) source.dataset.busy = "yes";
    showError(null);
    try {
      await handler(event, source);
    } catch (error) {
      showError(error);
    } finally {
      if (source) delete source.dataset.busy;
    }
  };
}

const titled = (title) => title.trim() || "(untitled)";

async function loadConversations() {
  const conversations = await allPages("/v1/user/conversations");
  $("#conversations").replaceChildren(
    ...conversations.map((conversation) =>
      element(
        "li",
        {},
        element("button", {
          type: "button",
          textContent: titled(conversation.title),
          title: conversation.lastMessagePreview || "",
          onclick: action(() => openConversation(conversation.id)),
        }),
      ),
    ),
  );
}

async function openConversation(id) {
  const opening = ++state.opening;
  const [conversation, messages, forks, members] = await Promise.all([
    api("GET", conversationPath(id)),
    allPages(conversationPath(id, "/messages")),
    api("GET", conversationPath(id, "/forks")),
    api("GET", conversationPath(id, "/memberships")),
  ]);
  // Another was opened meanwhile (a click after this one): that one is shown, and the next
  // message goes there, whichever answer came last.
  if (opening !== state.opening) return;
  state.conversationId = id;
  $("#conversation").hidden = false;
  $("#fork").hidden = true;
  $("#conversation-title").textContent = titled(conversation.title);
  $("#access-level").textContent = `you are ${conversation.accessLevel}`;

  $("#branches").replaceChildren(
    ...forks.data.map((fork) =>
      element("option", {
        value: fork.conversationId,
        selected: fork.isCurrentFork,
        textContent: titled(fork.title) + (fork.forkedAtConversationId ? " (fork)" : " (original)"),
      }),
    ),
  );

  $("#messages").replaceChildren(
    ...messages.map((message) => {
      const item = element(
        "li",
        { className: `message ${message.role}` },
        element("span", { className: "role", textContent: message.authorName || message.role }),
        element("span", { className: "content", textContent: message.content }),
      );
      item.dataset.id = message.id;
      if (message.role === "user") {
        item.append(
          " ",
          element("button", {
            type: "button",
            className: "fork",
            textContent: "Fork here",
            onclick: () => startFork(message),
          }),
        );
      }
      return item;
    }),
  );

  $("#members").replaceChildren(
    ...members.data.map((member) => element("li", { textContent: `${member.userId}: ${member.accessLevel}` })),
  );
}

function startFork(message) {
  const form = $("#fork");
  form.dataset.messageId = message.id;
  $("#fork-content").value = message.content;
  form.hidden = false;
  $("#fork-content").focus();
}

// --- Wiring ----------------------------------------------------------------------------------

$("#server").value = state.server;
$("#token").value = state.token;

$("#connect").addEventListener(
  "submit",
  action(async () => {
    state.server = $("#server").value.trim().replace(/\/+$/, "");
    state.token = $("#token").value.trim();
    localStorage.setItem("memsvc.server", state.server);
    sessionStorage.setItem("memsvc.token", state.token);
    $("#who").textContent = "";
    // Nothing of whoever was connected before stays on the page (nor is written to).
    state.conversationId = null;
    state.opening++;
    $("#conversation").hidden = true;
    for (const list of ["#conversations", "#messages", "#members", "#results", "#branches"]) {
      $(list).replaceChildren();
    }
    await loadConversations();
    $("#who").textContent = "connected";
  }),
);

$("#new-conversation").addEventListener(
  "submit",
  action(async (event, form) => {
    const conversation = await create(form, "/v1/user/conversations", {
      title: $("#new-title").value,
    });
    $("#new-title").value = "";
    await loadConversations();
    await openConversation(conversation.id);
  }),
);

$("#append").addEventListener(
  "submit",
  action(async (event, form) => {
    await create(form, conversationPath(state.conversationId, "/messages"), {
      content: $("#append-content").value,
    });
    $("#append-content").value = "";
    await openConversation(state.conversationId);
  }),
);

$("#fork").addEventListener(
  "submit",
  action(async (event, form) => {
    const messageId = form.dataset.messageId;
    const fork = await create(
      form,
      conversationPath(state.conversationId, `/messages/${encodeURIComponent(messageId)}/fork`),
      { newMessage: { content: $("#fork-content").value } },
    );
    await loadConversations();
    await openConversation(fork.id);
  }),
);

$("#fork-cancel").addEventListener("click", () => {
  $("#fork").hidden = true;
});

$("#branches").addEventListener(
  "change",
  action(() => openConversation($("#branches").value)),
);

$("#share").addEventListener(
  "submit",
  action(async (event, form) => {
    await create(form, conversationPath(state.conversationId, "/memberships"), {
      userId: $("#share-user").value.trim(),
      accessLevel: $("#share-level").value,
    });
    $("#share-user").value = "";
    await openConversation(state.conversationId);
  }),
);

$("#search").addEventListener(
  "submit",
  action(async () => {
    const results = await api("POST", "/v1/user/search/messages", { query: $("#search-query").value });
    const list = results.data.map((result) =>
      element(
        "li",
        {},
        element("button", {
          type: "button",
          textContent: result.message.content,
          onclick: action(() => openConversation(result.conversationId)),
        }),
      ),
    );
    $("#results").replaceChildren(...(list.length ? list : [element("li", { textContent: "No match." })]));
  }),
);
