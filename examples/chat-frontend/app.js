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
  constructor(message, status, code, details = {}) {
    super(message);
    this.status = status;
    this.code = code;
    this.details = details; // {"field": ["problem", ...]}: which input a 400 is about
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
    throw new ApiError(
      `${message} [${response.status} ${data?.code ?? ""}]${named}`,
      response.status,
      data?.code,
      data?.details ?? {},
    );
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

// A message's first words, to name what is about it (a button's label).
const NAMED_CHARS = 40;
function shortened(text) {
  const line = text.replace(/\s+/g, " ").trim();
  return line.length > NAMED_CHARS ? `${line.slice(0, NAMED_CHARS)}…` : line;
}

function element(tag, properties = {}, ...children) {
  const node = Object.assign(document.createElement(tag), properties);
  node.append(...children); // text stays text: nothing from the API is parsed as HTML
  return node;
}

// The alert says what failed; the field it is about, when there is one, is marked invalid and
// described by the alert, so that it is said on that field too (a11y review: only the alert
// said it). The next action clears both.
function showError(error, field = null) {
  $("#error").textContent = error ? error.message : "";
  for (const marked of document.querySelectorAll("[aria-invalid]")) {
    marked.removeAttribute("aria-invalid");
    marked.removeAttribute("aria-describedby");
  }
  if (error && field) {
    field.setAttribute("aria-invalid", "true");
    field.setAttribute("aria-describedby", "error");
  }
}

// The field an error is about: the input the API names in ``details`` (each name is one
// form's here), or the token for a 401 and the server when there was no answer at all, which
// are where to put it right whichever action it was.
const FIELDS = {
  title: "#new-title",
  content: "#append-content",
  "newMessage.content": "#fork-content",
  userId: "#share-user",
  accessLevel: "#share-level",
  query: "#search-query",
  unauthorized: "#token",
  network: "#server",
};

function fieldOf(error) {
  const named = Object.keys(error.details ?? {}).find((name) => name in FIELDS) ?? error.code;
  return named in FIELDS ? $(FIELDS[named]) : null;
}

// Every action: clear the last error, run, show the API's message when it fails (on its field
// too). A form or button whose action runs (``handler(event, itself)``) takes no second one
// meanwhile.
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
      showError(error, fieldOf(error));
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
          onclick: action(() => openConversation(conversation.id, { focus: true })),
        }),
      ),
    ),
  );
}

// ``focus``: the reader chose to open it (from the list, a search hit, a branch, a fork just
// made), and focus moves to its heading, which says which one is open; opening one said
// nothing, and a fork's left focus on <body> as the hidden editor took it (a11y review). A
// reload after a message or a share leaves focus where it is.
async function openConversation(id, { focus = false } = {}) {
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
            // (Named by its message: a screen reader's list of buttons was "Fork here" again
            // and again; review.)
            ariaLabel: `Fork here: ${shortened(message.content)}`,
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
  if (focus) $("#conversation-title").focus();
}

function startFork(message) {
  const form = $("#fork");
  form.dataset.messageId = message.id;
  $("#fork-content").value = message.content;
  form.hidden = false;
  $("#fork-content").focus();
}

// Cancel or Escape: focus goes back to the "Fork here" the editor was opened from; it fell to
// <body> with the hidden editor (a11y review).
function cancelFork() {
  const form = $("#fork");
  form.hidden = true;
  const from = $(`#messages li[data-id="${CSS.escape(form.dataset.messageId ?? "")}"] button.fork`);
  (from ?? $("#conversation-title")).focus();
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
    for (const list of ["#conversations", "#messages", "#members", "#results", "#branches", "#search-status"]) {
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
    await openConversation(conversation.id, { focus: true });
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
    await openConversation(fork.id, { focus: true });
  }),
);

$("#fork-cancel").addEventListener("click", cancelFork);

$("#fork").addEventListener("keydown", (event) => {
  if (event.key !== "Escape") return;
  event.preventDefault();
  cancelFork();
});

$("#branch").addEventListener(
  "submit",
  action(() => openConversation($("#branches").value, { focus: true })),
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
    // Emptied first, so that the same count after another search is said again.
    $("#search-status").textContent = "";
    const results = await api("POST", "/v1/user/search/messages", { query: $("#search-query").value });
    const list = results.data.map((result) =>
      element(
        "li",
        {},
        element("button", {
          type: "button",
          textContent: result.message.content,
          onclick: action(() => openConversation(result.conversationId, { focus: true })),
        }),
      ),
    );
    $("#results").replaceChildren(...list);
    // A status, said without moving focus: the hits only appeared (a11y review).
    const count = list.length;
    $("#search-status").textContent = `${count || "No"} message${count === 1 ? "" : "s"} found`;
  }),
);
